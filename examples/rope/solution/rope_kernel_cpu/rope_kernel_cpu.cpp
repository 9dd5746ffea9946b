// rope: the generic tier is the package's correctness reference and the fallback for
// small inputs: write it with ATen ops in fp32 and copy_ the result into the output(s)
// (one rounding to their dtype), e.g. out.copy_(f(x.to(at::kFloat))).
void rope(at::Tensor& out, const at::Tensor& q, const at::Tensor& cos, const at::Tensor& sin) {
  // In float64, as the baseline's reference: exact products, one rounding to q's dtype.
  TORCH_CHECK(cos.size(1) * 2 == q.size(2), "rope: cos and sin must have q.size(2) / 2 columns");
  const int64_t half = cos.size(1);
  const at::Tensor x = q.to(at::kDouble);
  const at::Tensor c = cos.to(at::kDouble).unsqueeze(1), s = sin.to(at::kDouble).unsqueeze(1);
  const at::Tensor x1 = x.narrow(2, 0, half), x2 = x.narrow(2, half, half);
  out.copy_(at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, 2).to(at::kFloat));
}

}  // namespace generic

}  // namespace rope_kernel_cpu
