#pragma once

#include <torch/library.h>

at::Tensor scale(const at::Tensor& x, double alpha);
int64_t omp_threads_in_region();
std::string active_tier();
