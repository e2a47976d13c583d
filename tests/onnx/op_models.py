#!/usr/bin/env python3
"""Small ONNX models of single operators for tests/test_onnx.c, laid out as the ONNX
backend test cases are (CASE/model.onnx, CASE/test_data_set_0/input_K.pb, output_K.pb),
the expected outputs computed here with NumPy:   op_models.py OUT_DIR
Exit status 77 when Debian's python3-onnx is not installed."""
import math, os, sys

try:
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper, TensorProto
except ImportError:
    sys.exit(77)

out = sys.argv[1]
rng = np.random.default_rng(7)
F = TensorProto.FLOAT


def case(name, nodes, inputs, outputs, inits=(), opset=17):
    """inputs: [(name, array)]; outputs: [(name, expected array)]."""
    g = helper.make_graph(nodes, name,
                          [helper.make_tensor_value_info(n, onnx.mapping.NP_TYPE_TO_TENSOR_TYPE[a.dtype], a.shape) for n, a in inputs],
                          [helper.make_tensor_value_info(n, onnx.mapping.NP_TYPE_TO_TENSOR_TYPE[a.dtype], a.shape) for n, a in outputs],
                          [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    d = os.path.join(out, name, "test_data_set_0")
    os.makedirs(d)
    onnx.save(m, os.path.join(out, name, "model.onnx"))
    for k, (n, a) in enumerate(inputs):
        open(os.path.join(d, "input_%d.pb" % k), "wb").write(numpy_helper.from_array(a, n).SerializeToString())
    for k, (n, a) in enumerate(outputs):
        open(os.path.join(d, "output_%d.pb" % k), "wb").write(numpy_helper.from_array(a, n).SerializeToString())


x = rng.standard_normal((2, 3, 4)).astype(np.float32)
y = rng.standard_normal((2, 3, 4)).astype(np.float32)
N = helper.make_node
case("where_greater", [N("Greater", ["x", "y"], ["c"]), N("Where", ["c", "x", "y"], ["z"])], [("x", x), ("y", y)], [("z", np.where(x > y, x, y))])
y2 = np.where(rng.random(x.shape) < 0.3, x, y)  # some equal elements
for op, f in [("Equal", np.equal), ("Less", np.less), ("LessOrEqual", np.less_equal), ("GreaterOrEqual", np.greater_equal)]:
    case("compare_" + op, [N(op, ["x", "y"], ["c"])], [("x", x), ("y", y2)], [("c", f(x, y2))])
case("not_and_or", [N("Greater", ["x", "y"], ["a"]), N("Less", ["x", "z"], ["b"]), N("And", ["a", "b"], ["p"]), N("Or", ["a", "b"], ["q"]),
                    N("Not", ["p"], ["r"]), N("Where", ["r", "x", "q2"], ["o"]), N("Cast", ["q"], ["q2"], to=F)],
     [("x", x), ("y", y), ("z", x * 0.5)], [("o", np.where(~((x > y) & (x < x * 0.5)), x, ((x > y) | (x < x * 0.5)).astype(np.float32)))])
e = rng.standard_normal((2, 1, 4)).astype(np.float32)
case("expand", [N("Expand", ["e", "shape"], ["o"])], [("e", e)], [("o", np.broadcast_to(e, (2, 3, 4)).copy())],
     [("shape", np.array([2, 3, 4], np.int64))], opset=13)
flat = x.reshape(2, 12)
case("shape_reshape", [N("Shape", ["x"], ["s"]), N("Reshape", ["f", "s"], ["o"])], [("x", x), ("f", flat)], [("o", x.copy())], opset=13)
case("constant_of_shape", [N("Shape", ["x"], ["s"]), N("ConstantOfShape", ["s"], ["c"], value=numpy_helper.from_array(np.array([1.5], np.float32))),
                           N("Add", ["x", "c"], ["o"])], [("x", x)], [("o", x + 1.5)], opset=13)
scale, bias = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
case("layer_norm", [N("LayerNormalization", ["x", "scale", "bias"], ["o"], epsilon=1e-5)], [("x", x)],
     [("o", ((x - mu) / np.sqrt(var + 1e-5) * scale + bias).astype(np.float32))], [("scale", scale), ("bias", bias)])
case("hard_sigmoid", [N("HardSigmoid", ["x"], ["o"], alpha=0.3, beta=0.4)], [("x", x)], [("o", np.clip(0.3 * x + 0.4, 0, 1))])
erf = np.vectorize(math.erf)
case("gelu", [N("Gelu", ["x"], ["o"])], [("x", x)], [("o", (0.5 * x * (1 + erf(x / math.sqrt(2)))).astype(np.float32))], opset=20)
case("gelu_tanh", [N("Gelu", ["x"], ["o"], approximate="tanh")], [("x", x)],
     [("o", (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))).astype(np.float32))], opset=20)
case("argmax", [N("ArgMax", ["x"], ["o"], axis=2, keepdims=0)], [("x", x)], [("o", np.argmax(x, 2).astype(np.int64))])
case("argmin_keep", [N("ArgMin", ["x"], ["o"], axis=1, keepdims=1)], [("x", x)], [("o", np.argmin(x, 1)[:, None, :].astype(np.int64))])
case("sin_cos_hardswish", [N("Sin", ["x"], ["s"]), N("Cos", ["s"], ["c"]), N("HardSwish", ["c"], ["o"])], [("x", x)],
     [("o", (np.cos(np.sin(x)) * np.clip(np.cos(np.sin(x)) / 6 + 0.5, 0, 1)).astype(np.float32))], opset=14)

# LRN across 5 channels: x / (bias + alpha / size * sum of x^2 over the window)^beta
im = rng.standard_normal((2, 7, 3, 4)).astype(np.float32)
sq = np.pad(im * im, ((0, 0), (2, 2), (0, 0), (0, 0)))
win = sum(sq[:, c:c + 7] for c in range(5))
case("lrn", [N("LRN", ["x"], ["o"], size=5, alpha=1e-3, beta=0.75, bias=2.0)], [("x", im)],
     [("o", (im / (2.0 + 1e-3 / 5 * win) ** 0.75).astype(np.float32))])
# Resize: nearest as PyTorch's interpolate (asymmetric, floor), x2; linear, half_pixel, to 5 x 7
sc = np.array([1, 1, 2, 2], np.float32)
near = im[:, :, np.floor(np.arange(6) / 2).astype(int)][:, :, :, np.floor(np.arange(8) / 2).astype(int)]
case("resize_nearest", [N("Resize", ["x", "", "scales"], ["o"], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
     [("x", im)], [("o", near)], [("scales", sc)], opset=13)


def linear_axis(n_in, n_out):
    src = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    i0 = np.floor(src).astype(int)
    return i0, np.minimum(i0 + 1, n_in - 1), (src - i0).astype(np.float32)


h0, h1, hw = linear_axis(3, 5)
w0, w1, ww = linear_axis(4, 7)
rows = im[:, :, h0] * (1 - hw)[:, None] + im[:, :, h1] * hw[:, None]
lin = rows[:, :, :, w0] * (1 - ww) + rows[:, :, :, w1] * ww
case("resize_linear", [N("Resize", ["x", "", "", "sizes"], ["o"], mode="linear", coordinate_transformation_mode="half_pixel")], [("x", im)],
     [("o", lin.astype(np.float32))], [("sizes", np.array([2, 7, 5, 7], np.int64))], opset=13)
