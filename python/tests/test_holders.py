"""The holder walk (vramscope_live/holders.py) against the stand-in torch:
a job whose training loop keeps what it should not, in the ways leak
reports show — a list of losses that keep their graphs, a forward hook
whose closure keeps outputs, a framework's container fed by `self.log`, an
accumulator — and the chains and fixes the helper sends at step
boundaries, or when attach asks.

Run: python3 -m unittest discover -s python/tests -v
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fake_torch"))
sys.path.insert(0, os.path.dirname(HERE))

import fake_torch  # noqa: E402
import torch  # noqa: E402  (the stand-in)
import vramscope_live  # noqa: E402
from vramscope_live import holders  # noqa: E402

from test_live import ADAM, LiveTestCase  # noqa: E402

MIB = 1 << 20


def holder_messages(client):
    out = []
    while True:
        f = client.read()
        if f is None or f["t"] == "bye":
            return out
        if f["t"] == "holders":
            out.append(f)


class _Results:
    """A stand-in for a framework's container of logged values."""

    def __init__(self):
        self.metrics = {}


_Results.__module__ = "lightning.pytorch.trainer.connectors.logger_connector.result"


class _Trainer:
    def __init__(self):
        self.results = _Results()


_Trainer.__module__ = "lightning.pytorch.trainer.trainer"


class LitModel(torch.nn.Module):
    """A user's module that logs through the framework, as `self.log` does."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(256, 256)
        self.trainer = _Trainer()

    def forward(self, x):
        return self.layer(x)

    def log(self, name, value):
        self.trainer.results.metrics.setdefault(name, []).append(value)


def leaky_loop(model, opt, steps, keep):
    """A training loop; `keep(loss, out)` is the line that leaks."""
    history = []
    for _ in range(steps):
        x = torch.randn(512, 256)  # 512 KiB
        out = model(x)
        loss = torch.sum(out)
        keep(history, loss, out)
        opt.step()
    return history


class HolderWalkTests(LiveTestCase):
    def setUp(self):
        super().setUp()
        self.saved_interval = vramscope_live.HOLDERS_MIN_INTERVAL_S
        self.saved_growth = vramscope_live.HOLDERS_MIN_GROWTH
        vramscope_live.HOLDERS_MIN_INTERVAL_S = 0.0
        vramscope_live.HOLDERS_MIN_GROWTH = 256 * 1024

    def tearDown(self):
        vramscope_live.HOLDERS_MIN_INTERVAL_S = self.saved_interval
        vramscope_live.HOLDERS_MIN_GROWTH = self.saved_growth
        super().tearDown()

    def run_job(self, keep, steps=4, model=None):
        # The test's own frames hold the stand-in job (thousands of entries):
        # a budget that walks all of it, so the chains do not depend on the
        # machine's speed (the budget's own test is below).
        client = self.connect(self.start(ADAM, holders_budget_ms=5000))
        model = model or torch.nn.Linear(256, 256)
        opt = torch.optim.SGD(model.parameters())
        kept = leaky_loop(model, opt, steps, keep)
        vramscope_live.stop()
        return holder_messages(client), kept

    def test_a_list_of_losses_is_named_with_its_graph_and_fix(self):
        msgs, _ = self.run_job(lambda h, loss, out: h.append(loss))
        # The first boundary is the baseline; each later one grew by a step.
        self.assertEqual([m["step"] for m in msgs], [1, 2, 3])
        m = msgs[-1]
        self.assertEqual(m["reason"], "grew")
        self.assertTrue(m["complete"])
        self.assertLessEqual(m["spent_ms"], m["budget_ms"] + 50)
        chain = next(c for c in m["chains"] if c["path"] == ["history"])
        self.assertRegex(chain["where"], r"^test_holders\.py:\d+ in leaky_loop$")
        self.assertEqual(chain["holder"], "list")
        self.assertEqual(chain["items"], 4)
        self.assertEqual(chain["example"]["link"], "[3]")
        self.assertEqual(chain["example"]["what"], "0-dim tensor float32, grad_fn=SumBackward0")
        # Its graph keeps x (mm's `self`) and relu's result, 512 KiB each;
        # the weight mm saved is a parameter: the model's, not the graph's.
        self.assertEqual(chain["example"]["graph_bytes"], 2 * 512 * 1024)
        self.assertEqual(chain["graph_bytes"], 4 * 2 * 512 * 1024)
        # One more 0-dim float32 since the last walk, and its graph (x and
        # relu's result).
        self.assertEqual(chain["grew_bytes"], 4 + 2 * 512 * 1024)
        self.assertIn("history.append(x.item())", chain["fix"])
        # The parameter and the optimizer's state are never reported.
        self.assertFalse([c for c in m["chains"] if "weight" in "".join(c["path"])])

    def test_objects_that_raise_when_read_neither_stop_the_walk_nor_reach_the_job(self):
        # A ctypes library loader loads a library named after any attribute
        # it is asked for (OSError for "func"); a dict whose items() raises.
        import ctypes

        class Broken(dict):
            def items(self):
                raise RuntimeError("not now")

        loader, broken = ctypes.cdll, Broken(x=1)

        def keep(h, loss, out):
            h.append(loss)
            h.append((loader, broken))

        msgs, _ = self.run_job(keep)
        self.assertEqual([m["step"] for m in msgs], [1, 2, 3])
        chain = next(c for c in msgs[-1]["chains"] if c["path"] == ["history"])
        self.assertEqual(chain["items"], 8)
        self.assertEqual(chain["graph_bytes"], 4 * 2 * 512 * 1024)
        self.assertNotIn("func", ctypes.cdll.__dict__, "the walk asked the loader for nothing")

    def test_a_backward_frees_what_the_graph_kept(self):
        def keep(h, loss, out):
            loss.backward()
            h.append(loss)

        msgs, history = self.run_job(keep)
        # 4 bytes a step: under the growth that starts a walk.
        self.assertEqual(msgs, [])
        fields, _ = holders.find(torch, sys._getframe(), 5000, None, "requested")
        chain = next(c for c in fields["chains"] if c["path"] == ["history"])
        self.assertEqual(chain["items"], 4)
        self.assertEqual(chain["graph_bytes"], 0, "a spent graph keeps no saved tensor")

    def test_a_leaf_that_requires_grad_is_kept_by_the_graphs_that_reach_it(self):
        # WGAN-GP's gradient maps: a leaf that is not a parameter (x_hat),
        # made each step and rebound; a kept result's graph reaches it only
        # through its AccumulateGrad (add and sum save no tensor), which
        # keeps the leaf and its .grad alive.
        kept = []
        for _ in range(3):
            x_hat = torch.randn(512, 256, requires_grad=True)  # 512 KiB
            x_hat.grad = torch.randn(512, 256)  # 512 KiB
            kept.append(torch.sum(x_hat + x_hat))

        def kept_chain():
            fields, _ = holders.find(torch, sys._getframe(1), 5000, None, "requested")
            return next(c for c in fields["chains"] if c["path"] == ["kept"])

        # The last x_hat still has its name: it and its .grad are the name's.
        chain = kept_chain()
        self.assertEqual(chain["items"], 3)
        self.assertEqual(chain["example"]["graph_bytes"], 0)
        self.assertEqual(chain["graph_bytes"], 2 * 2 * 512 * 1024)
        del x_hat
        chain = kept_chain()
        self.assertEqual(chain["example"]["graph_bytes"], 2 * 512 * 1024)
        self.assertEqual(chain["graph_bytes"], 3 * 2 * 512 * 1024)

    def test_an_unpack_hook_never_runs_and_what_it_packed_is_counted(self):
        # Non-reentrant checkpointing packs a placeholder and recomputes the
        # forward when a saved tensor is read; an offloading hook packs a
        # host copy and copies back. Reading either would allocate.
        unpacked = []

        def unpack(packed):
            unpacked.append(packed)
            return torch.randn(512, 256)

        x = torch.randn(512, 256, requires_grad=True)
        kept = [torch.sum(torch.relu(x * x))]
        mul = kept[0].grad_fn.next_functions[0][0].next_functions[0][0]
        mul.save_with_hooks("self", object(), unpack)  # checkpoint's placeholder
        mul.save_with_hooks("other", torch.randn(512, 256, device="cpu"), unpack)  # offloaded
        before = torch._tensor.ALLOCATED[0]
        fields, _ = holders.find(torch, sys._getframe(), 5000, None, "requested")
        self.assertEqual(unpacked, [], "no unpack hook ran")
        self.assertEqual(torch._tensor.ALLOCATED[0], before, "the walk allocated nothing")
        chain = next(c for c in fields["chains"] if c["path"] == ["kept"])
        # relu's result (512 KiB); what the two packs hold (a placeholder,
        # a host copy) is not the device's.
        self.assertEqual(chain["graph_bytes"], 512 * 1024)

    def test_a_hook_closure_is_named_through_the_module(self):
        model = torch.nn.Linear(256, 256)

        def attach(m):
            store = []
            return m.register_forward_hook(lambda mod, inputs, output: store.append(output))

        attach(model)
        msgs, _ = self.run_job(lambda h, loss, out: None, model=model)
        chain = msgs[-1]["chains"][0]
        self.assertEqual(chain["path"][0], "model")
        self.assertTrue(chain["path"][1].startswith("._forward_hooks["), chain["path"])
        self.assertEqual(chain["path"][2], "→(closure: store)")
        self.assertEqual(chain["holder"], "list")
        self.assertIn("handle.remove()", chain["fix"])

    def test_a_framework_container_points_at_the_users_call(self):
        model = LitModel()
        msgs, _ = self.run_job(lambda h, loss, out: model.log("loss", loss), model=model)
        chain = msgs[-1]["chains"][0]
        self.assertEqual(chain["path"], ["model", ".trainer", ".results", ".metrics", "['loss']"])
        self.assertIn('self.log("loss", loss.detach())', chain["fix"])
        self.assertTrue(chain["fix"].startswith("lightning keeps"), chain["fix"])

    def test_an_accumulator_is_told_to_add_numbers(self):
        def loop():
            client = self.connect(self.start(ADAM, holders_budget_ms=5000))
            model = torch.nn.Linear(256, 256)
            opt = torch.optim.SGD(model.parameters())
            total = torch.sum(model(torch.randn(512, 256)))
            for _ in range(4):
                total = total + torch.sum(model(torch.randn(512, 256)))
                opt.step()
            vramscope_live.stop()
            return holder_messages(client)

        msgs = loop()
        chain = next(c for c in msgs[-1]["chains"] if c["path"] == ["total"])
        self.assertEqual(chain["holder"], "name")
        self.assertEqual(chain["what"], "0-dim tensor float32, grad_fn=AddBackward0")
        self.assertIn("total += x.item()", chain["fix"])
        self.assertGreater(chain["graph_bytes"], 4 * MIB)

    def test_attach_can_ask_and_a_flat_job_says_nothing_by_itself(self):
        client = self.connect(self.start(ADAM, holders_budget_ms=5000))
        model = torch.nn.Linear(256, 256)
        opt = torch.optim.SGD(model.parameters())
        last = None
        for i in range(4):
            last = torch.sum(model(torch.randn(512, 256)))  # rebound: flat
            if i == 2:
                client.send({"t": "find_holders"})
                import time

                deadline = time.monotonic() + 5
                while not vramscope_live._SESSION.holders_requested and time.monotonic() < deadline:
                    time.sleep(0.01)  # the helper's client thread takes it
            opt.step()
        # The walks themselves keep nothing alive (before Python 3.13 a frame's
        # f_locals would hold the last step's tensors): memory stays flat.
        allocated = vramscope_live._SESSION.allocated()
        self.assertEqual(allocated, vramscope_live._SESSION.holders_alloc)
        vramscope_live.stop()
        msgs = holder_messages(client)
        self.assertEqual([m["reason"] for m in msgs], ["requested"])
        self.assertEqual(msgs[0]["step"], 2)
        self.assertTrue(any(c["path"] == ["last"] for c in msgs[0]["chains"]), msgs[0]["chains"])
        self.assertIsNotNone(last)

    def test_the_budget_bounds_the_walk_and_says_so(self):
        big = [[torch.randn(1, 1) for _ in range(200)] for _ in range(200)]  # 40,000 tensors
        fields, _ = holders.find(torch, sys._getframe(), 0.001, {}, "requested")
        self.assertFalse(fields["complete"])
        self.assertLess(fields["spent_ms"], 200)
        fields, _ = holders.find(torch, sys._getframe(), 10_000, {}, "requested")
        self.assertTrue(fields["complete"])
        self.assertTrue(any(c["path"][:1] == ["big"] for c in fields["chains"]))
        del big

    def test_at_an_oom_the_largest_holders_are_named_from_the_failing_frame(self):
        from test_live import _OutOfMemoryError

        client = self.connect(self.start(ADAM, holders_budget_ms=5000))
        model = torch.nn.Linear(256, 256)

        def evaluate():
            outputs = []  # the pile-up within one call: every batch's output, with its graph
            for _ in range(3):
                outputs.append(model(torch.randn(512, 256)))
            raise _OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 79.19 GiB")

        try:
            evaluate()
        except _OutOfMemoryError as e:
            vramscope_live.report_oom(e)
        vramscope_live.stop()
        msgs = holder_messages(client)
        self.assertEqual([m["reason"] for m in msgs], ["oom"])
        self.assertIsNone(msgs[0]["step"])
        chain = next(c for c in msgs[0]["chains"] if c["path"] == ["outputs"])
        self.assertTrue(chain["where"].endswith("in evaluate"), chain)
        self.assertEqual(chain["items"], 3)
        # Three 512 x 256 fp32 outputs, each graph keeping its 512 KiB input x.
        self.assertEqual(chain["bytes"], 3 * 512 * 1024)
        self.assertEqual(chain["graph_bytes"], 3 * 512 * 1024)


if __name__ == "__main__":
    unittest.main()
