"""Reads a training program's --tensorboard directory with TensorBoard's own reader
(EventAccumulator, PyPI `tensorboard` in the tests' .venv) and checks it against the
JSONL --log of the same runs: every tag, step and value, and the samples the program
printed (tests/test_train_run.c runs it).

usage: check_events.py TB_DIR LOG.jsonl STDOUT_FILE

A resumed run redoes the steps after its checkpoint; the log then has them twice, and
TensorBoard keeps only the later ones (the program's SessionLog START, SummaryWriter's
purge_step). The log is read the same way: a training step at or below the last one seen
drops every entry from that step on. Prints one line per tag; exits 1 at the first
difference, naming it."""
import json
import math
import os
import re
import socket
import sys

from tensorboard.backend.event_processing import event_accumulator as ea


def fail(msg):
    print("check_events: " + msg)
    sys.exit(1)


def expected_from_log(path):
    """{tag: {step: value}} as the events should hold them."""
    want = {}
    last = 0
    with open(path) as f:
        for line in f:
            rec = json.loads(re.sub(r"(?<=: )-?nan\b", "NaN", line))  # C's %g of NaN
            step = rec.pop("step")
            if "loss" in rec:  # a training step
                if step <= last:  # a resumed run redoes it: drop the earlier run's from here
                    for series in want.values():
                        for s in [s for s in series if s >= step]:
                            del series[s]
                last = step
                for key, value in rec.items():
                    if key in ("skipped", "skipped_steps"):
                        continue
                    if value is not None:
                        want.setdefault("train/" + key, {})[step] = value
            else:  # an evaluation: eval_loss, eval_METRIC, and the samples it covered (not a curve)
                rec.pop("samples", None)
                for key, value in rec.items():
                    want.setdefault("eval/" + key[len("eval_"):], {})[step] = value
    return want


def main():
    tb_dir, log_path, stdout_path = sys.argv[1:4]
    names = sorted(os.listdir(tb_dir))
    pattern = r"events\.out\.tfevents\.\d{10}\.%s\.\d+(\.\d+)?$" % re.escape(socket.gethostname())
    for name in names:
        if not re.match(pattern, name):
            fail("%s: not named events.out.tfevents.<time>.<host>.<pid>" % name)
    print("files: %d" % len(names))

    acc = ea.EventAccumulator(tb_dir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    want = expected_from_log(log_path)
    rate = [t for t in tags["scalars"] if t in ("train/samples_per_s", "train/tokens_per_s")]
    trained = "train/loss" in want  # not only --eval
    if sorted(tags["scalars"]) != sorted(list(want) + rate) or len(rate) != trained:
        fail("scalar tags %s, the log has %s%s" % (sorted(tags["scalars"]), sorted(want), " and a throughput" if trained else ""))

    for tag in sorted(want):
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        if steps != sorted(want[tag]):
            fail("%s: steps %s, the log has %s" % (tag, steps, sorted(want[tag])))
        for e in events:
            w = want[tag][e.step]
            close = math.isclose(e.value, w, rel_tol=1e-5, abs_tol=1e-30)  # the log's %.6g
            if not close and not (math.isnan(e.value) and math.isnan(w)):
                fail("%s at step %d: %r, the log has %r" % (tag, e.step, e.value, w))
        print("%s: %d steps" % (tag, len(steps)))
    for tag in rate:
        events = acc.Scalars(tag)
        if [e.step for e in events] != sorted(want["train/loss"]) or not all(e.value > 0 for e in events):
            fail("%s: not one positive value at each training step" % tag)
        print("%s: %d steps" % (tag, len(events)))

    with open(stdout_path) as f:
        printed = f.read()
    shown = re.findall(r"^sample at step (\d+): ", printed, re.M)
    texts = tags["tensors"]
    if not shown:
        if texts:
            fail("text tags %s, but the program printed no sample" % texts)
        return
    if texts != ["samples/text"] or "samples/text" not in acc.PluginTagToContent("text"):
        fail("text tags %s: want samples/text of the text plugin" % texts)
    events = acc.Tensors("samples/text")
    if [str(e.step) for e in events] != shown:
        fail("samples/text at steps %s, the program printed samples at %s" % ([e.step for e in events], shown))
    for e in events:
        t = e.tensor_proto
        if t.dtype != 7 or len(t.string_val) != 1 or [d.size for d in t.tensor_shape.dim] != [1]:
            fail("samples/text at step %d: not one DT_STRING: %s" % (e.step, t))
        md = t.string_val[0].decode()
        lines = md.split("\n")
        if not all(l.startswith("    ") for l in lines):
            fail("samples/text at step %d: not a Markdown code block: %r" % (e.step, md))
        text = "\n".join(l[4:] for l in lines)
        if "sample at step %d: %s\n" % (e.step, text) not in printed:
            fail("samples/text at step %d: %r was not printed" % (e.step, text))
    print("samples/text: %d samples" % len(events))


main()
