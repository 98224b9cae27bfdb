// Runs a Paddle Inference Predictor for placeenv.native, which calls this through ctypes with the
// GIL released. `run` is paddle_infer::Predictor::Run() from Paddle's own library: a member
// function, whose `this` the Itanium C++ ABI passes as its first argument. A C++ exception must
// not unwind through ctypes' C frames (the process would abort), so it ends here and comes back
// as a return code and its message.
#include <cstddef>
#include <cstring>
#include <exception>

namespace {

void copy_message(const char* text, char* out, std::size_t size) {
  if (size == 0) return;
  std::strncpy(out, text, size - 1);
  out[size - 1] = '\0';
}

}  // namespace

// 0: ran; 1: Run() returned false; 2: it threw, `message` says what.
extern "C" int placeenv_predictor_run(bool (*run)(void*), void* predictor, char* message,
                                      std::size_t size) {
  try {
    return run(predictor) ? 0 : 1;
  } catch (const std::exception& error) {
    copy_message(error.what(), message, size);
  } catch (...) {
    copy_message("a C++ exception that is not a std::exception", message, size);
  }
  return 2;
}
