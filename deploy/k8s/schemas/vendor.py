"""Extract a CRD's openAPIV3Schema into the small file the tests read.

    python deploy/k8s/schemas/vendor.py CRD.yaml VERSION OUT.json[.gz]

The schema is written unchanged (compact JSON, keys sorted; gzip for ``.gz``, byte for
byte reproducible), so a refresh from a newer CRD is this command again, and the sources
are in README.md.
"""

from __future__ import annotations

import gzip
import json
import sys

import yaml


def main(crd_path: str, version: str, out: str) -> None:
    with open(crd_path) as f:
        crd = yaml.safe_load(f)
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = {
        "crd": crd["metadata"]["name"], "version": version,
        "openAPIV3Schema": entry["schema"]["openAPIV3Schema"],
    }
    data = json.dumps(schema, separators=(",", ":"), sort_keys=True).encode()
    if out.endswith(".gz"):  # no name or time in the header: the same CRD gives the same bytes
        data = gzip.compress(data, mtime=0)
    with open(out, "wb") as f:
        f.write(data)


if __name__ == "__main__":
    main(*sys.argv[1:])
