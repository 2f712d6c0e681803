"""rollpack.sampling_mask.masked_token_logprobs (docs/trainer.md,
"Sampling-mask log-probabilities"):

- the torch backend against a plain torch reference written per row (gather
  the kept logits, logsumexp, autograd for the gradient), and
  torch.autograd.gradcheck in float64;
- the semantics of empty lists (the full vocabulary), dropped targets (-inf,
  no gradient), shifted offsets (next-token alignment), uint16 ids as int16;
  refusals naming the row;
- the native backend (librollpack_trainer.so's kernels/masked_logprob.h, here
  its CPU reference) equal to the torch backend, forward and gradient.

CPU torch. The native tests need librollpack_trainer.so with the kernels
($ROLLPACK_TRAINER_LIBRARY): without it they skip, unless
ROLLPACK_TRAINER_REQUIRED=1 (CTest). The CUDA kernel is held to the CPU
reference by kernels/masked_logprob_gpu_test.cu on a GPU, and timed against
torch by kernels/bench/masked_logprob_bench.py.
"""

import os
import unittest

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

if torch is not None:
    from rollpack import sampling_mask
    from rollpack.sampling_mask import masked_token_logprobs

REQUIRED = os.environ.get("ROLLPACK_TRAINER_REQUIRED") == "1"


def reference(logits, sets, targets):
    """Per row, the obvious way: gather + logsumexp (full row when no mask)."""
    out, lses = [], []
    for t, s in enumerate(sets):
        row = logits[t].to(torch.float64)
        kept = row if not s else row[torch.tensor(s, dtype=torch.long)]
        lse = torch.logsumexp(kept, 0)
        y = int(targets[t])
        lp = row[y] - lse if (not s or y in s) else torch.tensor(float("-inf"),
                                                               dtype=torch.float64)
        out.append(lp)
        lses.append(lse)
    return torch.stack(out), torch.stack(lses)


def random_problem(gen, rows, vocab, drop_every=0):
    """Random kept sets (a fifth empty), targets from the set, every
    drop_every-th row's target outside it."""
    sets, targets = [], []
    for t in range(rows):
        kind = int(torch.randint(0, 5, (1,), generator=gen))
        if kind == 0:
            s = []
        else:
            n = int(torch.randint(1, vocab + 1, (1,), generator=gen))
            s = torch.randperm(vocab, generator=gen)[:n].tolist()
        if s and drop_every and t % drop_every == 0 and len(s) < vocab:
            y = next(v for v in range(vocab) if v not in s)
        else:
            pool = s or list(range(vocab))
            y = pool[int(torch.randint(0, len(pool), (1,), generator=gen))]
        sets.append(s)
        targets.append(y)
    values = torch.tensor([v for s in sets for v in s], dtype=torch.int32)
    offsets = torch.tensor([0] + [len(s) for s in sets]).cumsum(0)
    return sets, values, offsets, torch.tensor(targets)


@unittest.skipIf(torch is None, "needs torch")
class TorchBackendTest(unittest.TestCase):
    def test_forward_and_gradient_equal_the_per_row_reference(self):
        gen = torch.Generator().manual_seed(39)
        for dtype, tol in ((torch.float32, 2e-5), (torch.float64, 1e-12),
                           (torch.bfloat16, 2e-5)):
            for rows, vocab in ((1, 1), (7, 5), (40, 97), (13, 600)):
                sets, values, offsets, targets = random_problem(gen, rows, vocab, drop_every=4)
                logits = (torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 4
                          ).to(dtype).requires_grad_()
                lp, lse = masked_token_logprobs(logits, values, offsets, targets,
                                                return_lse=True, backend="torch")
                self.assertEqual(lp.dtype, torch.float64 if dtype == torch.float64
                                 else torch.float32)
                leaf = logits.detach().to(torch.float64).requires_grad_()
                want_lp, want_lse = reference(leaf, sets, targets)
                finite = torch.isfinite(want_lp)
                self.assertTrue(torch.equal(torch.isfinite(lp), finite))
                torch.testing.assert_close(lp[finite].double(), want_lp[finite], rtol=tol,
                                           atol=tol)
                torch.testing.assert_close(lse.double(), want_lse, rtol=tol, atol=tol)
                # A loss through both outputs, the -inf rows left out of it.
                w1 = torch.randn(rows, generator=gen, dtype=torch.float64)
                w2 = torch.randn(rows, generator=gen, dtype=torch.float64)
                (lp[finite].double() * w1[finite]).sum().add(
                    (lse.double() * w2).sum()).backward()
                (want_lp[finite] * w1[finite]).sum().add((want_lse * w2).sum()).backward()
                gtol = tol if dtype != torch.bfloat16 else 1e-2
                torch.testing.assert_close(logits.grad.double(), leaf.grad, rtol=gtol,
                                           atol=gtol)

    def test_gradcheck_float64(self):
        gen = torch.Generator().manual_seed(7)
        sets, values, offsets, targets = random_problem(gen, 9, 11, drop_every=3)
        logits = torch.randn(9, 11, generator=gen, dtype=torch.float64, requires_grad=True)

        def f(x):
            lp, lse = masked_token_logprobs(x, values, offsets, targets, return_lse=True)
            return torch.where(torch.isfinite(lp), lp, torch.zeros_like(lp)), lse

        self.assertTrue(torch.autograd.gradcheck(f, (logits,), eps=1e-6, atol=1e-8))

    def test_empty_list_is_the_full_vocabulary_and_dropped_target_is_minus_inf(self):
        for backend in ("torch", "native"):
            if backend == "native" and sampling_mask._native() is None:
                continue  # NativeBackendTest says why
            with self.subTest(backend=backend):
                logits = torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]], requires_grad=True)
                values = torch.tensor([0, 1], dtype=torch.int32)
                offsets = torch.tensor([0, 0, 2])
                lp, lse = masked_token_logprobs(logits, values, offsets, torch.tensor([2, 2]),
                                                return_lse=True, backend=backend)
                full = torch.logsumexp(torch.tensor([0.0, 1.0, 2.0]), 0)
                torch.testing.assert_close(lp[0], 2 - full)
                self.assertEqual(float(lp[1]), float("-inf"))
                torch.testing.assert_close(lse[1], torch.logsumexp(torch.tensor([0.0, 1.0]), 0))
                (lp[0] + lse[1]).backward()
                p = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), 0)
                torch.testing.assert_close(logits.grad[0], torch.tensor([0.0, 0.0, 1.0]) - p)
                q = torch.softmax(torch.tensor([0.0, 1.0]), 0)
                torch.testing.assert_close(logits.grad[1], torch.cat([q, torch.zeros(1)]))

    def test_shifted_offsets_and_uint16_ids(self):
        # Next-token alignment: rows 0..T-2 predict tokens 1..T-1, whose lists
        # are offsets[1:]; ids above 32767 arrive as int16 (uint16 on the wire).
        vocab = 40000
        gen = torch.Generator().manual_seed(3)
        logits = torch.randn(4, vocab, generator=gen)
        lists = [[], [5, 39999, 32768], [1], [7, 8]]
        tokens = torch.tensor([11, 32768, 1, 8])
        values = torch.tensor([v for s in lists for v in s], dtype=torch.int32)
        offsets = torch.tensor([0, 0, 3, 4, 6])
        as_u16 = values.to(torch.int64).to(torch.int16)  # two's complement of the uint16
        want, _ = reference(logits[:-1], lists[1:], tokens[1:])
        lp = masked_token_logprobs(logits[:-1], as_u16, offsets[1:], tokens[1:],
                                   backend="torch")
        torch.testing.assert_close(lp.double(), want)
        if sampling_mask._native() is not None:
            lp = masked_token_logprobs(logits[:-1], as_u16, offsets[1:], tokens[1:],
                                       backend="native")
            torch.testing.assert_close(lp.double(), want)

    def test_refusals_name_the_row(self):
        logits = torch.zeros(3, 4)
        ok = dict(values=torch.tensor([1, 2, 3]), offsets=torch.tensor([0, 2, 2, 3]),
                  target_ids=torch.tensor([1, 0, 3]))
        masked_token_logprobs(logits, **ok, backend="torch")
        cases = [
            (dict(values=torch.tensor([1, 2, 4])), "kept id outside [0, V = 4) at row 2"),
            (dict(values=torch.tensor([1, 1, 3])), "kept id repeated at row 0"),
            (dict(target_ids=torch.tensor([1, -1, 3])), "target outside [0, V = 4) at row 1"),
            (dict(offsets=torch.tensor([0, 2, 1, 3])), "offsets decrease at row 1"),
            (dict(offsets=torch.tensor([0, 2, 2, 9])), "outside the 3 values"),
            (dict(offsets=torch.tensor([0, 2, 3])), "need offsets [4]"),
        ]
        for change, msg in cases:
            with self.subTest(msg=msg):
                with self.assertRaises(ValueError) as cm:
                    masked_token_logprobs(logits, **{**ok, **change}, backend="torch")
                self.assertIn(msg, str(cm.exception))
        with self.assertRaises(TypeError):
            masked_token_logprobs(logits.half(), **ok)
        with self.assertRaises(ValueError):
            masked_token_logprobs(logits, **ok, backend="cuda")


@unittest.skipIf(torch is None, "needs torch")
class NativeBackendTest(unittest.TestCase):
    def setUp(self):
        if sampling_mask._native() is None:
            msg = ("librollpack_trainer.so with rpt_masked_logprob_forward is not loadable "
                   "($ROLLPACK_TRAINER_LIBRARY)")
            if REQUIRED:
                self.fail(msg)
            self.skipTest(msg)

    def test_equals_the_torch_backend(self):
        gen = torch.Generator().manual_seed(11)
        for dtype in (torch.float32, torch.bfloat16):
            for vtype in (torch.int16, torch.int32, torch.int64):
                sets, values, offsets, targets = random_problem(gen, 23, 301, drop_every=5)
                logits = (torch.randn(23, 301, generator=gen) * 4).to(dtype)
                outs = []
                for backend in ("native", "torch"):
                    x = logits.clone().requires_grad_()
                    lp, lse = masked_token_logprobs(x, values.to(vtype), offsets.to(torch.int32),
                                                    targets, return_lse=True, backend=backend)
                    finite = torch.isfinite(lp)
                    (lp[finite] * torch.arange(int(finite.sum()))).sum().add(
                        (lse * 0.5).sum()).backward()
                    outs.append((lp, lse, x.grad.float()))
                (lp_n, lse_n, g_n), (lp_t, lse_t, g_t) = outs
                self.assertEqual(lp_n.dtype, torch.float32)
                self.assertEqual(g_n.shape, logits.shape)
                torch.testing.assert_close(lp_n, lp_t, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(lse_n, lse_t, rtol=1e-5, atol=1e-5)
                gtol = 1e-5 if dtype == torch.float32 else 2e-2
                torch.testing.assert_close(g_n, g_t, rtol=gtol, atol=gtol)

    def test_cpu_reference_refusals_name_the_row(self):
        logits = torch.zeros(3, 4)
        with self.assertRaises(ValueError) as cm:
            masked_token_logprobs(logits, torch.tensor([1, 2, 7], dtype=torch.int32),
                                  torch.tensor([0, 2, 2, 3]), torch.tensor([1, 0, 3]),
                                  backend="native")
        self.assertIn("kept id 7 of row 2 outside [0, V = 4)", str(cm.exception))
        with self.assertRaises(TypeError):
            masked_token_logprobs(logits.double(), torch.tensor([1], dtype=torch.int32),
                                  torch.tensor([0, 1, 1, 1]), torch.tensor([1, 0, 3]),
                                  backend="native")


if __name__ == "__main__":
    unittest.main()
