"""Multi-device Paddle inference service built on placeenv (see ``python -m service --help``)."""
