#include <torch/library.h>

#include "registration.h"
#include "torch_binding.h"

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("scale(Tensor x, float alpha) -> Tensor");
  ops.def("omp_threads_in_region() -> int");
  ops.impl("omp_threads_in_region", &omp_threads_in_region);
  ops.def("active_tier() -> str");
  ops.impl("active_tier", &active_tier);
}

// The CPU kernel is registered through the IMPL macro so both registration.h
// macros are exercised by the tests.
TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CPU, ops) {
  ops.impl("scale", &scale);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
