/* op_cases.h — small models exercising every op, function and built-in module, shared by
 * the gradient tests (test_autodiff.c) and the generated-code tests (test_codegen.c). Each
 * op case differentiates loss = sum(y * y / 2 + y) of its body. */
#ifndef KILN_TESTS_OP_CASES_H
#define KILN_TESTS_OP_CASES_H

typedef struct {
    const char *name;
    const char *inputs; /* forward inputs */
    const char *body;   /* statements assigning y */
} OpCase;

/* Each case differentiates loss = sum(y * y / 2 + y) w.r.t. the inputs (and parameters). */
static const OpCase op_cases[] = {
    {"neg", "x: f32[3, 4]", "y = -x"},
    {"abs", "x: f32[3, 4]", "y = abs(x)"},
    {"exp", "x: f32[3, 4]", "y = exp(x)"},
    {"log", "x: f32[3, 4]", "y = log(exp(x) + 1)"},
    {"sqrt", "x: f32[3, 4]", "y = sqrt(x * x + 0.5)"},
    {"tanh", "x: f32[3, 4]", "y = tanh(x)"},
    {"sigmoid", "x: f32[3, 4]", "y = sigmoid(x)"},
    {"relu", "x: f32[3, 4]", "y = relu(x)"},
    {"cast", "x: f64[3, 4]", "y = f32(x) * 2"},
    {"add_broadcast", "x: f32[3, 4], z: f32[4]", "y = x + z"},
    {"sub_size1", "x: f32[3, 1], z: f32[1, 4]", "y = x - z"},
    {"mul_broadcast", "x: f32[2, 3, 4], z: f32[3, 1]", "y = x * z"},
    {"div", "x: f32[3, 4], z: f32[3, 4]", "y = x / (exp(z) + 0.5)"},
    {"div_scalar_left", "x: f32[3, 4]", "y = 2 / (x * x + 1)"},
    {"maximum", "x: f32[3, 4], z: f32[4]", "y = maximum(x, z)"},
    {"minimum", "x: f32[3, 4], z: f32[3, 4]", "y = minimum(x, z)"},
    {"pow", "x: f32[3, 4], z: f32[3, 4]", "y = pow(exp(x), z)"},
    {"pow_operator", "x: f32[3, 4]", "y = x ** 3"},
    {"where", "x: f32[3, 4], z: f32[3, 4]", "y = where(x > z, x * 2, z * 3)"},
    {"where_broadcast", "x: f32[4, 5, 2], z: f32[4, 5, 1]", "y = where(x > 0, x * z, z)"},
    {"where_f64", "x: f64[3, 4]", "y = f32(where(x > 0, x, x * 3))"},
    {"sum_axis", "x: f32[2, 3, 4]", "y = sum(x, axis = 1)"},
    {"sum_axes_keepdim", "x: f32[2, 3, 4]", "y = sum(x, axis = [0, 2], keepdim = true) * x"},
    /* inner axes of 10 elements: one row per SIMD lane (c_loops.c), with a total */
    {"sum_axes_lanes", "x: f32[5, 6, 2]", "y = sum(x, axis = [0, 2], keepdim = true) * x"},
    {"mean_all", "x: f32[2, 3, 4]", "y = mean(x * x)"},
    {"max_axis", "x: f32[2, 3, 4]", "y = max(x, axis = -1)"},
    {"min_all", "x: f32[3, 4]", "y = min(x)"},
    {"var", "x: f32[3, 5]", "y = var(x, axis = 1)"},
    {"reshape", "x: f32[2, 6]", "y = reshape(x, 3, 4) * reshape(x, [3, -1])"},
    {"flatten", "x: f32[2, 3, 2]", "y = flatten(x)"},
    {"transpose", "x: f32[2, 3, 4]", "y = transpose(x, 0, 2)"},
    {"permute", "x: f32[2, 3, 4, 1]", "y = permute(x, 3, 1, 0, 2)"},
    {"unsqueeze_squeeze", "x: f32[3, 4]", "y = squeeze(unsqueeze(x, 1) * 2)"},
    {"slice", "x: f32[5, 7]", "y = x[1:4, 2:7:2]"},
    {"slice_index", "x: f32[5, 7]", "y = x[2, 1:6] + x[:, 6]"},
    /* PyTorch's indexing: `...` and new axes (`none`) among integers and slices */
    {"index_ellipsis_none", "x: f32[2, 3, 4]", "y = x[..., 1][:, :, none] * x[none, 1, ..., 0:4:2] + x[:, 2, none, 0:4:2][..., none, :, :][:, 0]"},
    {"split", "x: f32[3, 6]", "a, b = split(x, [2, 4], axis = 1)\n y = sum(a, axis = 1) * sum(b, axis = 1)"},
    {"chunk_concat", "x: f32[4, 6]", "a, b, c = chunk(x, 3)\n y = concat(c, a, b * 2, axis = 1)"},
    /* copies large enough to be shared between threads (c.c open_par_loops) */
    {"slice_large", "x: f32[80, 30, 34]", "y = x[:, 1:29, 2:34:2]"},
    {"chunk_concat_large", "x: f32[64, 8, 80]", "a, b = chunk(x, 2, axis = 2)\n y = concat(b, a * 2, axis = 2)"},
    {"permute_large", "x: f32[16, 40, 60]", "y = permute(x, 2, 0, 1) * 2"},
    {"softmax", "x: f32[3, 5]", "y = softmax(x) * x"},
    {"log_softmax", "x: f32[3, 5]", "y = log_softmax(x, axis = 0)"},
    {"logsumexp", "x: f32[3, 5]", "y = logsumexp(x)"},
    {"gelu", "x: f32[3, 4]", "y = gelu(x)"},
    {"gelu_tanh", "x: f32[3, 4]", "y = gelu(x, approximate = \"tanh\")"},
    {"erf", "x: f32[3, 4]", "y = erf(x)"},
    {"sin_cos", "x: f32[3, 4]", "y = sin(x) * cos(2 * x)"},
    {"silu", "x: f32[3, 4]", "y = silu(x)"},
    {"leaky_relu", "x: f32[3, 4]", "y = leaky_relu(x, 0.2) + leaky_relu(x)"},
    {"elu", "x: f32[3, 4]", "y = elu(x * 40, alpha = 0.5)"},
    {"softplus", "x: f32[3, 4]", "y = softplus(x) + softplus(x * 30, beta = 2, threshold = 5)"},
    {"mish", "x: f32[3, 4]", "y = mish(x * 3)"},
    {"hardswish", "x: f32[3, 4]", "y = hardswish(x * 5) + hardsigmoid(x * 5)"},
    {"floor_divide", "x: f32[3, 4], z: f32[4]", "y = x // (abs(z) + 0.5) + (x * 3) % 2 - x % (abs(z) + 0.5)"},
    {"int_floor_divide", "x: f32[3, 4], t: i32[3, 4]", "y = x * f32(t // 3) + x * f32(t % 3) + x * f32(7 // (abs(t) + 1) - (-7) % 3 + (-7) // 2)"},
    {"zeros_ones_full", "x: f32[3, 4]", "y = x * ones(3, 4) + zeros([4]) + full([3, 1], 2.5) + f32(full([1], 2))"},
    {"like", "x: f32[3, 4]", "y = x * ones_like(x) + zeros_like(x) + full_like(x, 0.5)"},
    {"tril_triu", "x: f32[2, 3, 4]", "y = tril(x) + triu(x, 1) * 2 + tril(x, diagonal = -1)"},
    {"masked_fill", "x: f32[3, 4]", "y = masked_fill(x, x > 0.2, -1.5) + masked_fill(x, tril(ones(3, 4)) == 0, 0)"},
    {"expand", "x: f32[3, 1], z: f32[4]", "y = expand(x, 2, 3, 4) + expand(z, 3, -1)"},
    {"flip", "x: f32[2, 3, 4]", "y = flip(x, [0, 2]) + flip(x, 1) * x"},
    {"stack", "x: f32[3, 4], z: f32[3, 4]", "y = stack([x, z * 2, x * z], dim = 1)"},
    {"stack_last", "x: f32[3, 4], z: f32[3, 4]", "y = stack(x, z, dim = -1)"},
    {"methods", "x: f32[2, 3, 4]",
     "y = x.view(x.shape[0], -1).softmax(-1).mean(1, keepdim = true) * x.reshape(2, 12) + x.transpose(0, 2).sum(0).exp().mean()"
     " + x.size(2) * x.float().std()"},
    {"sdpa", "x: f32[2, 3, 4], z: f32[2, 5, 4]",
     "y = scaled_dot_product_attention(x, z, z * 2) + scaled_dot_product_attention(x, x, x, is_causal = true, scale = 0.3)"
     " + scaled_dot_product_attention(x, z, z, attn_mask = x[:, :, 0:1] - z[:, :, 1:2].transpose(1, 2))"
     " + scaled_dot_product_attention(x, z, z, attn_mask = tril(ones(3, 5)) > 0)"},
    {"cumsum", "x: f32[3, 4]", "y = cumsum(x, 1) + cumsum(x, dim = 0) * x"},
    {"rotary", "x: f32[2, 3, 5, 4]", "y = rotary(x) + rotary(x, base = 100)"},
    {"gather_dim", "x: f32[3, 4], t: i64[3, 2]", "y = gather(x, 1, t) + gather(x.transpose(0, 1), 0, t.transpose(0, 1)).transpose(0, 1)"},
    {"functional_layers", "x: f32[2, 2, 4, 4], w: f32[3, 4], z: f32[3]",
     "y = linear(x, w, z).sum() + linear(x, w).mean() + layer_norm(x, [4, 4]) + layer_norm(x, 4, weight = x[0, 0, 0], bias = x[0, 0, 1])"
     " + max_pool2d(x, 2).sum() + avg_pool2d(x, 3, stride = 1, padding = 1)"},
    {"functional_pools", "x: f32[2, 2, 6, 7]",
     "y = max_pool2d(x, [3, 2], stride = [2, 1], padding = 1, dilation = [1, 2], ceil_mode = true).sum()"
     " + avg_pool2d(x, 3, 2, 1, ceil_mode = true, count_include_pad = false).sum() + avg_pool2d(x, [2, 3])"},
    {"einsum", "x: f32[2, 3, 4], z: f32[2, 4, 5]",
     "y = einsum(\"bij,bjk->bik\", x, z) + einsum(\"bij->bi\", x).sum() + einsum(\"bij,bjk\", x, z).sum() * einsum(\"ijk->kji\", x).mean()"
     " + einsum(\"bij, bij -> b\", x, x).sum() + einsum(\"i,j->ij\", x[0, 0], z[0, 0]).sum()"},
    {"interpolate", "x: f32[2, 3, 4, 5]",
     "y = interpolate(x, scale_factor = 2).sum() + interpolate(x, size = [3, 7], mode = \"bilinear\")"
     " + interpolate(x, size = [3, 7], mode = \"bilinear\", align_corners = true) + interpolate(x, scale_factor = [0.75, 1.5]).sum()"},
    {"topk", "x: f32[3, 5]", "v, i = topk(x, 2)\n w, j = topk(x, 3, dim = 0, largest = false)\n y = v.sum() + w.sum(0) * f32(i[0, 0] + j[0, 0])"},
    {"std", "x: f32[3, 5]", "y = std(x, axis = 1, keepdim = true) + std(x, dim = 0, keepdim = true, unbiased = false)"},
    {"clamp", "x: f32[3, 4]", "y = clamp(x, -0.5, 0.7)"},
    {"matmul", "x: f32[3, 4], z: f32[4, 5]", "y = x @ z"},
    {"matmul_batched", "x: f32[2, 3, 4], z: f32[2, 4, 5]", "y = x @ z"},
    {"matmul_broadcast", "x: f32[2, 3, 4], z: f32[4, 5]", "y = x @ z"},
    {"matmul_batch_broadcast", "x: f32[3, 4], z: f32[2, 4, 5]", "y = x @ z"},
    {"matmul_vector", "x: f32[4], z: f32[4, 5]", "y = x @ z"},
    /* operands BLAS reads in place (strided views), and views it cannot (copied first) */
    {"matmul_transposed", "x: f32[4, 3], z: f32[5, 4]", "y = transpose(x) @ transpose(z)"},
    {"matmul_heads", "x: f32[2, 3, 12]",
     "q, k, v = split(x, 4, axis = 2)\n"
     " q = permute(reshape(q, 2, 3, 2, 2), 0, 2, 1, 3)\n k = permute(reshape(k, 2, 3, 2, 2), 0, 2, 3, 1)\n"
     " v = permute(reshape(v, 2, 3, 2, 2), 0, 2, 1, 3)\n y = (q @ k) @ v"},
    {"matmul_view_also_read", "x: f32[4, 3], z: f32[4, 5]", "y = transpose(x) @ z + sum(transpose(x), axis = 1, keepdim = true)"},
    {"matmul_step_slice", "x: f32[3, 8], z: f32[4, 5]", "y = x[:, 0:8:2] @ z"},
    {"matmul_written_permuted", "x: f32[2, 3, 4], z: f32[2, 4, 5]", "y = permute(x @ z, 1, 0, 2) * 2"},
    /* products summed over every batch axis are accumulated by BLAS (fusion's summed GEMM);
     * over some of them, or read elsewhere too, they are stored and summed by a loop */
    {"matmul_summed", "x: f32[2, 3, 4, 5], z: f32[2, 3, 5, 6]", "y = sum(x @ z, axis = [0, 1])"},
    {"matmul_summed_broadcast", "x: f32[4, 5], z: f32[3, 5, 6]", "y = sum(x @ z, axis = 0) * 2"},
    {"matmul_summed_partly", "x: f32[2, 3, 4, 5], z: f32[2, 3, 5, 6]", "y = sum(x @ z, axis = 1)"},
    {"matmul_summed_also_read", "x: f32[3, 4, 5], z: f32[3, 5, 6]", "y = sum(x @ z, axis = 0) + x @ z"},
    {"matmul_written_transposed", "x: f32[2, 3, 4], z: f32[2, 4, 5]", "y = permute(x @ z, 2, 0, 1)"},
    /* single rows and columns (BLAS's matrix-vector product), operands transposed or not */
    {"matmul_matrix_vector", "x: f32[4, 3], z: f32[4]", "y = transpose(x) @ z + x[0:3, :] @ z[0:3]"},
    {"matmul_row_vector", "x: f32[4, 1], z: f32[4, 5]", "y = transpose(x) @ z + transpose(z[:, 0:1]) @ z"},
    {"matmul_column_vector_large", "x: f32[400, 300], z: f32[300, 1]", "y = x @ z"},
    /* large enough (kiln_gemm_plan: 2^21 multiply-adds) for tasks shared between threads:
     * blocks of rows, of columns, of each product of a batch, and of products written
     * permuted or transposed */
    {"matmul_shared_rows", "x: f32[256, 512], z: f32[256, 256]", "y = (transpose(x) @ z) * 0.01"},
    {"matmul_shared_columns", "x: f32[64, 256], z: f32[256, 512]", "y = relu(x @ z) - 0.01"},
    {"matmul_batch_blocks", "x: f32[2, 640, 256], z: f32[256, 256]", "y = (x @ z) * 0.01"},
    {"matmul_summed_blocks", "x: f32[4, 128, 600], z: f32[4, 600, 96]", "y = sum(x @ z, axis = 0) * 0.01"},
    /* few multiply-adds (K = 10), an epilogue over 2^15 outputs: shared for its epilogue
     * (positive terms: the loss, a float sum, stays within the tolerance at -O1) */
    {"matmul_epilogue_blocks", "x: f32[128, 10], z: f32[10, 256]", "y = relu(x @ z) + 1"},
    {"matmul_written_blocks", "x: f32[2, 768, 128], z: f32[2, 128, 256]", "y = permute(x @ z, 1, 0, 2) * 2"},
    {"matmul_written_transposed_blocks", "x: f32[2, 768, 128], z: f32[2, 128, 256]", "y = permute(x @ z, 2, 0, 1)"},
    {"matmul_merged_permute", "x: f32[2, 3, 4], z: f32[6, 5]", "y = reshape(permute(x, 2, 1, 0), 4, 6) @ z"},
    {"cross_entropy", "x: f32[4, 5], t: i64[4]", "y = cross_entropy(x, t)"},
    {"cross_entropy_3d", "x: f32[2, 3, 5], t: i32[2, 3]", "y = cross_entropy(x, t)"},
    {"mse", "x: f32[3, 4], z: f32[3, 4]", "y = mse(x, z)"},
    /* class probabilities as the target: the gradient reaches both */
    {"cross_entropy_probs", "x: f32[4, 5], p: f32[4, 5], w: f32[5], z: f32[2, 5, 3]",
     "y = cross_entropy(x, softmax(p)) + cross_entropy(x, softmax(p), label_smoothing = 0.2, weight = exp(w), reduction = \"sum\")"
     " + cross_entropy(z, softmax(z * 2, 1), axis = 1, reduction = \"none\").sum() + cross_entropy(z, sigmoid(z), axis = -1)"},
    {"cross_entropy_options", "x: f32[4, 5], t: i64[4]",
     "y = cross_entropy(x, t, ignore_index = 2, label_smoothing = 0.1) + cross_entropy(x, t, reduction = \"sum\") * 0.1"},
    {"nll_loss", "x: f32[2, 3, 5], t: i32[2, 3]", "y = nll_loss(log_softmax(x), t) + nll_loss(x, t, ignore_index = 1, reduction = \"none\")"},
    {"class_weights", "x: f32[4, 5], t: i64[4], w: f32[5]",
     "y = cross_entropy(x, t, weight = exp(w)) + nll_loss(log_softmax(x), t, weight = exp(w), ignore_index = 1)"
     " + cross_entropy(x, t, weight = exp(w), label_smoothing = 0.2, reduction = \"sum\")"},
    /* PyTorch's [N, C, d1, ...] inputs with [N, d1, ...] targets (classes on axis 1), and the
     * class axis written where a target fits both axis 1 and the last */
    {"cross_entropy_axis1", "x: f32[2, 4, 3], t: i64[2, 3], w: f32[4], z: f32[2, 4, 3, 2], u: i32[2, 3, 2], c: f32[2, 3, 3], s: i64[2, 3]",
     "y = cross_entropy(x, t, weight = exp(w), ignore_index = 1, label_smoothing = 0.1) + cross_entropy(z, u, reduction = \"sum\") * 0.1"
     " + nll_loss(log_softmax(x, 1), t, reduction = \"none\") + nll_loss(log_softmax(z, 1), u, weight = exp(w), ignore_index = 0)"
     " + cross_entropy(c, s, axis = 1) * cross_entropy(c, s, axis = -1, reduction = \"none\")"},
    {"kl_div", "x: f32[3, 4], z: f32[3, 4]",
     "y = kl_div(log_softmax(x), softmax(z), reduction = \"batchmean\") + kl_div(log_softmax(x), log_softmax(z), log_target = true)"
     " + kl_div(log_softmax(x), relu(z), reduction = \"none\")"},
    {"regression_losses", "x: f32[3, 4], z: f32[3, 4]",
     "y = l1_loss(x, z) + smooth_l1_loss(x * 2, z, beta = 0.5) + huber_loss(x * 2, z, delta = 0.7, reduction = \"sum\")"
     " + smooth_l1_loss(x, z, reduction = \"none\", beta = 0)"},
    {"bce_with_logits", "x: f32[3, 4], z: f32[3, 4], w: f32[4]",
     "y = binary_cross_entropy_with_logits(x * 3, sigmoid(z))"
     " + binary_cross_entropy_with_logits(x, sigmoid(z), pos_weight = exp(w), weight = sigmoid(w), reduction = \"none\")"},
    {"one_hot", "x: f32[4, 5], t: i64[4]", "y = x * one_hot(t, 5)"},
    {"symbolic_batch", "x: f32[B, 4]", "y = x * mean(x)"},
};

typedef struct {
    const char *name;
    const char *members;
    const char *inputs;
    const char *body;
} ModuleCase;

static const ModuleCase module_cases[] = {
    {"Linear", "m = Linear(4, 3)", "x: f32[B, 4]", "y = m(x)"},
    {"Linear_nobias_3d", "m = Linear(4, 3, bias = false)", "x: f32[2, 3, 4]", "y = m(x)"},
    /* products shared between threads (kiln_gemm_plan) forward and backward, in blocks of
     * rows and of columns; and a batch of one row (BLAS's matrix-vector product) */
    {"Linear_large", "m = Linear(256, 512)", "x: f32[96, 256]", "y = gelu(m(x))"},
    {"Linear_batch1", "m = Linear(64, 32)", "x: f32[1, 64]", "y = m(x)"},
    /* matrix-vector products large enough to be shared between threads (kiln_gemm.h) */
    {"Linear_batch1_large", "m = Linear(300, 260)", "x: f32[1, 300]", "y = relu(m(x))"},
    {"Conv2d", "m = Conv2d(2, 3, 3, padding = 1)", "x: f32[2, 2, 5, 5]", "y = m(x)"},
    {"Conv2d_large", "m = Conv2d(3, 4, 3, padding = 1)", "x: f32[2, 3, 40, 40]", "y = m(x)"},
    {"Conv2d_stride_dilation", "m = Conv2d(1, 2, 2, stride = 2, dilation = 2)", "x: f32[1, 1, 7, 7]", "y = m(x)"},
    {"MaxPool2d", "m = MaxPool2d(2)", "x: f32[2, 2, 4, 4]", "y = m(x)"},
    {"MaxPool2d_pad_stride", "m = MaxPool2d(3, stride = 2, padding = 1)", "x: f32[1, 2, 5, 5]", "y = m(x)"},
    {"AvgPool2d", "m = AvgPool2d(2, padding = 1)", "x: f32[1, 2, 4, 4]", "y = m(x)"},
    /* windows that tile the image: reshaped and reduced in place, the ragged edge dropped */
    {"MaxPool2d_ragged", "m = MaxPool2d(2)", "x: f32[2, 3, 5, 7]", "y = m(x)"},
    /* windows of 4 in rows of 5: one window per SIMD lane (cnn's pooling kernels too) */
    {"MaxPool2d_lanes", "m = MaxPool2d(2)", "x: f32[2, 3, 8, 10]", "y = relu(m(x))"},
    {"AvgPool2d_tiles", "m = AvgPool2d(3)", "x: f32[1, 2, 6, 7]", "y = m(x)"},
    {"BatchNorm2d", "m = BatchNorm2d(3)", "x: f32[2, 3, 2, 2]", "y = m(x)"},
    {"LayerNorm", "m = LayerNorm(5)", "x: f32[2, 3, 5]", "y = m(x)"},
    {"Embedding", "m = Embedding(7, 4)", "i: i32[2, 3], x: f32[4]", "y = m(i) * x"},
    /* indices computed in the model: checked in the step (check_index) */
    {"Embedding_computed", "m = Embedding(7, 4)", "i: i32[2, 3], x: f32[4]", "y = m(i32(clamp(f32(i) * 2 - 3, 0, 6))) * x"},
    {"Dropout", "m = Dropout(0.3)", "x: f32[4, 5]", "y = m(x)"},
    {"MLP", "m = MLP(4, 8)", "x: f32[2, 3, 4]", "y = m(x)"},
    {"CausalSelfAttention", "m = CausalSelfAttention(8, 2)", "x: f32[2, T, 8]", "y = m(x)"},
    {"tied_weights", "e = Embedding(6, 4)", "i: i32[2, 3]", "y = e(i) @ transpose(e.weight)"},
    {"checkpoint", "a = Linear(4, 4)\nb = Linear(4, 4)", "x: f32[2, 4]", "y = checkpoint(b(relu(a(x))))"},
    {"Parameter", "s = Parameter(4, init = normal(0, 1))", "x: f32[3, 4]", "y = x * s"},
    /* issue 20: the modules a PyTorch user reaches for */
    {"Sequential", "net = Sequential(Linear(4, 6), ReLU(), Linear(6, 3, bias = false), Tanh())", "x: f32[B, 4]", "y = net(x)"},
    {"activation_modules",
     "a = GELU()\nb = GELU(approximate = \"tanh\")\nc = SiLU()\nd = Sigmoid()\ne = LeakyReLU(0.2)\nf = ELU(alpha = 0.7)\n"
     "g = Softplus(beta = 2)\nh = Mish()\ni = Hardswish()\nj = Hardsigmoid()\nk = Identity()",
     "x: f32[3, 4]", "y = a(x) + b(x) + c(x) + d(x) + e(x) + f(x) + g(x) + h(x) + i(x * 4) + j(x * 4) + k(x)"},
    {"Flatten", "net = Sequential(Flatten(), Linear(6, 2))", "x: f32[2, 2, 3]", "y = net(x)"},
    {"Conv1d", "m = Conv1d(2, 3, 3, padding = 1)", "x: f32[2, 2, 6]", "y = m(x)"},
    {"Conv1d_stride_dilation_nobias", "m = Conv1d(2, 3, 2, stride = 2, dilation = 2, bias = false)", "x: f32[1, 2, 9]", "y = m(x)"},
    {"Conv2d_tuples", "m = Conv2d(2, 3, [3, 1], stride = [1, 2], padding = [1, 0], bias = false)", "x: f32[2, 2, 5, 6]", "y = m(x)"},
    {"Conv2d_groups_same", "m = Conv2d(4, 6, 3, padding = \"same\", groups = 2)", "x: f32[2, 4, 5, 5]", "y = m(x)"},
    {"Conv2d_depthwise_same_even", "m = Conv2d(3, 3, [2, 4], padding = \"same\", groups = 3, dilation = [1, 2])", "x: f32[1, 3, 5, 6]", "y = m(x)"},
    {"Conv1d_groups_valid", "m = Conv1d(4, 2, 3, padding = \"valid\", groups = 2)", "x: f32[2, 4, 7]", "y = m(x)"},
    {"LayerNorm_dims", "m = LayerNorm([3, 4])", "x: f32[2, 3, 4]", "y = m(x)"},
    {"LSTM", "m = LSTM(3, 4, num_layers = 2)", "x: f32[3, 2, 3]",
     "o, hc = m(x)\n y = concat(flatten(o), flatten(hc[0]), flatten(hc[1]), dim = 0)"},
    {"GRU", "m = GRU(3, 4, batch_first = true, bias = false)", "x: f32[2, 3, 3]", "o, h = m(x)\n y = o.sum(1) + h[0]"},
    /* bidirectional: *_reverse parameters, outputs [T, N, 2H] (forward, reverse), h_n [2 layers, N, H] */
    {"LSTM_bidirectional", "m = LSTM(3, 2, num_layers = 2, bidirectional = true)", "x: f32[3, 2, 3]",
     "o, hc = m(x)\n y = concat(flatten(o, 0), flatten(hc[0], 0) * 2, flatten(hc[1], 0), dim = 0)"},
    {"GRU_bidirectional", "m = GRU(3, 2, batch_first = true, bias = false, bidirectional = true)\nn = GRU(3, 2, bidirectional = true)",
     "x: f32[2, 3, 3]", "o, h = m(x)\n p, u = n(x)\n y = o.sum(1) * h[1, 0, 0] + concat(h[0], h[1], dim = 1) + p[:, 0] * u.mean()"},
    {"MaxPool2d_options", "m = MaxPool2d([3, 2], stride = [2, 1], padding = 1, dilation = [1, 2], ceil_mode = true)", "x: f32[2, 2, 6, 7]",
     "y = m(x)"},
    {"AvgPool2d_options", "m = AvgPool2d(3, stride = 2, padding = 1, ceil_mode = true, count_include_pad = false)\nn = AvgPool2d([2, 3], ceil_mode = true)",
     "x: f32[1, 2, 6, 7]", "y = m(x).sum() + n(x)"},
    {"ConvTranspose2d", "m = ConvTranspose2d(2, 3, 3, stride = 2, padding = 1, output_padding = 1)", "x: f32[2, 2, 3, 3]", "y = m(x)"},
    {"ConvTranspose2d_dilation_nobias", "m = ConvTranspose2d(2, 2, [2, 3], dilation = 2, bias = false)", "x: f32[1, 2, 3, 4]", "y = m(x)"},
    {"Upsample", "a = Upsample(scale_factor = 2)\nb = Upsample(size = [5, 3], mode = \"bilinear\")", "x: f32[1, 2, 3, 4]", "y = a(b(x))"},
    {"EmbeddingBag", "m = EmbeddingBag(7, 4)\nn = EmbeddingBag(7, 4, mode = \"sum\")\no = EmbeddingBag(7, 4, mode = \"max\")",
     "i: i32[2, 3], x: f32[4]", "y = (m(i) + n(i) + o(i)) * x"},
    /* padding_idx: that row gets no gradient (j repeats index 0 often); EmbeddingBag leaves
     * it out of its bags (a bag of nothing but padding gives zeros) */
    {"Embedding_padding_idx", "a = Embedding(7, 4, padding_idx = 0)\nb = Embedding(7, 4, padding_idx = -2)", "i: i32[2, 3], x: f32[4]",
     "j = i32(clamp(f32(i) - 2, 0, 6))\n y = (a(j) + b(i) + a(i)) * x"},
    {"EmbeddingBag_padding_idx",
     "m = EmbeddingBag(7, 4, padding_idx = 0)\nn = EmbeddingBag(7, 4, mode = \"sum\", padding_idx = 1)\n"
     "o = EmbeddingBag(7, 4, mode = \"max\", padding_idx = 0)",
     "i: i32[2, 3], x: f32[4]", "j = i32(clamp(f32(i) - 3, 0, 6))\n y = (m(j) + n(i) + o(j) + m(i * 0) + o(i * 0)) * x"},
    {"MultiheadAttention", "m = MultiheadAttention(8, 2, batch_first = true)", "x: f32[2, 3, 8], z: f32[2, 5, 8]",
     "o, w = m(x, z, z)\n y = o * 2 + w.sum()"},
    {"MultiheadAttention_seq_first", "m = MultiheadAttention(4, 1, bias = false)", "x: f32[3, 2, 4]", "y = m(x, x, x)[0]"},
    {"BatchNorm1d", "m = BatchNorm1d(3)", "x: f32[4, 3]", "y = m(x)"},
    {"BatchNorm1d_3d", "m = BatchNorm1d(3, affine = false)", "x: f32[2, 3, 4]", "y = m(x)"},
    {"GroupNorm", "m = GroupNorm(2, 4)", "x: f32[2, 4, 3, 2]", "y = m(x)"},
    {"RMSNorm", "m = RMSNorm(5)", "x: f32[2, 3, 5]", "y = m(x)"},
    {"RMSNorm_eps", "m = RMSNorm(5, eps = 1e-5, elementwise_affine = false)", "x: f32[2, 5]", "y = m(x)"},
    {"AdaptiveAvgPool2d_1", "m = AdaptiveAvgPool2d(1)", "x: f32[2, 3, 4, 5]", "y = m(x)"},
    {"AdaptiveAvgPool2d_divisible", "m = AdaptiveAvgPool2d([2, 3])", "x: f32[2, 3, 4, 6]", "y = m(x)"},
};


/* The model text of a case, into buf. */
static inline void op_case_text(char *buf, size_t n, const OpCase *c)
{
    /* No batch in a train section: the inputs' leading sizes are not a batch */
    snprintf(buf, n, "model t\ndim B <= 3\nforward(%s) -> y {\n %s\n}\nloss(y) = sum(y * y / 2 + y)\n", c->inputs, c->body);
}

static inline void module_case_text(char *buf, size_t n, const ModuleCase *c)
{
    snprintf(buf, n, "model t\ndim B <= 2\ndim T <= 4\n%s\nforward(%s) -> y {\n %s\n}\nloss(y) = sum(y * y / 2 + y)\n", c->members,
             c->inputs, c->body);
}

#endif
