"""R3 end to end: rollout routing -> rollpack -> a different trainer layout
-> replay through the kernels (docs/trainer.md, "The proof").

1. A tiny MoE language model in torch (float64; 8 layers, layers 0 and 5
   dense, E=64 experts, top-6, softmax-then-renormalise gating through
   rollpack.apply_replay) samples rollouts autoregressively, and its "engine"
   pass records, per token and MoE layer, the chosen experts (n - 1 rows, as
   vLLM/SGLang return) and the log-probability of every sampled token.
2. The samples go to a real rollpackd (started here on 127.0.0.1, ephemeral
   port) through the Python producer; a step is created for a trainer layout
   unlike the rollout's: cp=2 (zigzag), tp=2 with sequence parallel, pp=2.
3. Every one of the 8 ranks is fetched with rollpack.TrainerClient on the
   device (pinned staging, async copies, unpack kernel). The script puts the
   global packed stream back together from the ranks' pieces (CP zigzag, SP
   router rows, pipeline layers), rank by rank on one GPU.
4. The trainer forward on the packed stream replays those ids: routing
   agreement (routing_agreement kernel, live top-K vs replayed) and
   log-probabilities vs the rollout; then the trainer's weights are
   perturbed and the forward is run without replay (its own top-K) and with
   replay.

Prints one JSON object (also written to --json); exits 1 if a claim fails:
delivered ids != recorded ids, agreement < 1 with replay, log-prob mismatch
> --tol with replay on the rollout weights, or no-replay agreement not below
replay agreement after the perturbation.

    python3 client/python/examples/r3_proof.py --device cuda --rollpackd build/bin/rollpackd
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rollpack  # noqa: E402
from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc  # noqa: E402
from rollpack.trainer import TrainerClient  # noqa: E402

DT = torch.float64


class TinyMoE:
    def __init__(self, vocab=512, hidden=64, ffn=64, layers=8, dense=(0, 5), experts=64, topk=6,
                 seed=0, device="cpu"):
        g = torch.Generator().manual_seed(seed)
        self.V, self.H, self.F, self.N, self.E, self.K = vocab, hidden, ffn, layers, experts, topk
        self.dense = set(dense)
        self.moe_layers = [l for l in range(layers) if l not in self.dense]

        def p(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g, dtype=DT) * scale).to(device)

        h, f = hidden, ffn
        self.params = {"emb": p(vocab, h), "out": p(h, vocab, scale=h ** -0.5)}
        for l in range(layers):
            self.params["mix%d" % l] = p(h, h, scale=h ** -0.5)
            if l in self.dense:
                self.params["w1_%d" % l] = p(h, f, scale=h ** -0.5)
                self.params["w2_%d" % l] = p(f, h, scale=f ** -0.5)
            else:
                self.params["router%d" % l] = p(h, experts, scale=2 * h ** -0.5)
                self.params["e1_%d" % l] = p(experts, h, f, scale=h ** -0.5)
                self.params["e2_%d" % l] = p(experts, f, h, scale=f ** -0.5)

    def perturbed(self, rel, seed):
        g = torch.Generator().manual_seed(seed)
        other = TinyMoE.__new__(TinyMoE)
        other.__dict__.update(self.__dict__)
        other.params = {}
        for k, v in self.params.items():
            noise = torch.randn(v.shape, generator=g, dtype=DT).to(v.device)
            other.params[k] = v + rel * v.std() * noise
        return other

    @staticmethod
    def _norm(x):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)

    def forward(self, tokens, seg_id, seg_pos, route):
        """tokens [T] of a packed stream; seg_id/seg_pos [T]: sequence and
        position in it (causal mixing never crosses sequences). route(l,
        logits fp64 [T, E]) -> ids [T, K]. Returns (log-probs [T, V], router
        logits {l: [T, E]} float32)."""
        P = self.params
        h = P["emb"][tokens.long()]
        router_logits = {}
        for l in range(self.N):
            x = self._norm(h)
            # Causal prefix mean inside each sequence.
            c = torch.cumsum(x, 0)
            first = torch.nonzero(seg_pos == 0).flatten()
            base = torch.zeros_like(c)
            base[1:] = c[:-1]
            seg_base = base[first]  # cumsum before each sequence's first token
            c = c - seg_base[seg_id]
            h = h + (c / (seg_pos.to(DT) + 1).unsqueeze(1)) @ P["mix%d" % l]
            x = self._norm(h)
            if l in self.dense:
                h = h + torch.nn.functional.gelu(x @ P["w1_%d" % l]) @ P["w2_%d" % l]
                continue
            logits = x @ P["router%d" % l]
            router_logits[l] = logits.float()
            ids = route(l, logits)
            probs, _, dense = rollpack.apply_replay(logits.float().contiguous(), ids,
                                                    score="softmax", renormalize=True, dense=True)
            y = torch.einsum("th,ehf->tef", x, P["e1_%d" % l])
            y = torch.einsum("tef,efh->teh", torch.nn.functional.gelu(y), P["e2_%d" % l])
            h = h + torch.einsum("te,teh->th", dense.to(DT), y)
        logp = torch.log_softmax(self._norm(h) @ P["out"], dim=-1)
        return logp, router_logits


def own_topk(model):
    return lambda l, logits: logits.topk(model.K, dim=-1).indices


def segments(lengths, device):
    seg_id = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])
    seg_pos = torch.cat([torch.arange(n) for n in lengths])
    return seg_id.to(device), seg_pos.to(device)


def rollout(model, num, prompt, max_new, seed, device):
    """Samples `num` sequences; returns tokens, recorded ids and log-probs."""
    g = torch.Generator(device=device).manual_seed(seed)
    cur = torch.randint(1, model.V, (num, prompt), generator=g, device=device)
    for _ in range(max_new):
        b, t = cur.shape
        seg_id, seg_pos = segments([t] * b, device)
        logp, _ = model.forward(cur.flatten(), seg_id, seg_pos, own_topk(model))
        last = logp.view(b, t, -1)[:, -1].exp()
        nxt = torch.multinomial(last.float(), 1, generator=g)
        cur = torch.cat([cur, nxt], 1)
    rng = np.random.default_rng(seed)
    lengths = [int(rng.integers(prompt + 4, prompt + max_new + 1)) for _ in range(num)]
    seqs = [cur[i, :n] for i, n in enumerate(lengths)]
    # The engine's pass over the final sequences: recorded routing + log-probs.
    seg_id, seg_pos = segments(lengths, device)
    stream = torch.cat(seqs)
    recorded = {}

    def record(l, logits):
        ids = logits.topk(model.K, dim=-1).indices
        recorded[l] = ids
        return ids

    logp, _ = model.forward(stream, seg_id, seg_pos, record)
    out, off = [], 0
    for i, n in enumerate(lengths):
        toks = stream[off:off + n]
        lp = torch.zeros(n, dtype=DT, device=device)
        lp[1:] = logp[off:off + n - 1].gather(1, toks[1:].long().unsqueeze(1)).squeeze(1)
        ids = torch.stack([recorded[l][off:off + n - 1] for l in model.moe_layers], 1)  # [n-1, M, K]
        out.append({"id": "r%d" % i, "tokens": toks.int().cpu(), "ids": ids.cpu(), "logp": lp.cpu()})
        off += n
    return out


def start_rollpackd(exe):
    d = tempfile.mkdtemp(prefix="r3-")
    port_file = os.path.join(d, "port")
    log = open(os.path.join(d, "log"), "wb")
    proc = subprocess.Popen([exe, "--listen", "127.0.0.1:0", "--port-file", port_file],
                            stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError("rollpackd exited: %s" % open(log.name).read()[-2000:])
        if os.path.exists(port_file) and open(port_file).read().strip():
            return proc, "127.0.0.1:%d" % int(open(port_file).read())
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("rollpackd did not start")


def unzigzag_positions(padded, c, r):
    """Global padded positions (within each sequence) of CP rank r's local
    rows, per sequence, in local order (layout.md section 4), written here
    independently of rollpack's scheduler."""
    out = []
    for p in padded:
        h = p // (2 * c)
        out.append(list(range(r * h, (r + 1) * h)) + list(range((2 * c - 1 - r) * h, (2 * c - r) * h)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rollpackd", default=os.environ.get("ROLLPACKD", "build/bin/rollpackd"))
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=160)
    ap.add_argument("--max-tokens-per-rank", type=int, default=512)
    ap.add_argument("--perturb", type=float, default=0.01)
    ap.add_argument("--tol", type=float, default=1e-9)
    ap.add_argument("--json")
    args = ap.parse_args()
    device = torch.device(args.device)
    t0 = time.time()
    model = TinyMoE(device=device)
    M, K, E = len(model.moe_layers), model.K, model.E
    samples = rollout(model, args.samples, args.prompt, args.max_new, 1, device)
    by_id = {s["id"]: s for s in samples}
    t_rollout = time.time() - t0

    proc, address = start_rollpackd(args.rollpackd)
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "binding": "ctypes", "samples": len(samples),
              "tokens": int(sum(s["tokens"].numel() for s in samples)),
              "model": {"layers": model.N, "dense_layers": sorted(model.dense), "E": E, "K": K,
                        "moe_layers": model.moe_layers},
              "layout": {"dp": 1, "cp": 2, "tp": 2, "pp": 2, "sequence_parallel": True,
                         "max_tokens_per_rank": args.max_tokens_per_rank}}
    try:
        spec = rollpack.ModelSpec("tiny-moe", num_layers=model.N, moe_layers=model.moe_layers,
                                  num_experts=E, topk=K)
        with rollpack.Producer(address, "r3") as p:
            p.register_model(spec)
            p.put([rollpack.Sample(s["id"], s["tokens"].numpy(), s["ids"].numpy().astype(np.int32),
                                   token_fields={"logprobs": s["logp"].float().numpy()})
                   for s in samples])
        import grpc
        ch = grpc.insecure_channel(address)
        sched = scheduler_pb2_grpc.SchedulerStub(ch)
        cp, tp, pp = 2, 2, 2
        info = sched.CreateStep(scheduler_pb2.CreateStepRequest(
            step_id="r3", pool="r3", num_samples=len(samples),
            topology=scheduler_pb2.Topology(dp=1, cp=cp, tp=tp, pp=pp,
                                            max_tokens_per_rank=args.max_tokens_per_rank)),
            timeout=60)
        report["microbatches"] = info.num_microbatches
        # Every rank, on the device.
        t1 = time.time()
        got = {}
        for r in range(cp):
            for t in range(tp):
                for s in range(pp):
                    got[(r, t, s)] = list(TrainerClient(address, "r3", (0, r, t, s), device))
        report["fetch_all_ranks_s"] = round(time.time() - t1, 3)
        ch.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)

    stats = {"delivered_rows_checked": 0, "delivered_mismatches": 0, "logprob_field_mismatches": 0}
    res = {"replay": [], "noreplay_perturbed": [], "replay_perturbed": [], "replay_used_perturbed": []}
    dlp = {"replay": [], "noreplay_perturbed": [], "replay_perturbed": []}
    perturbed = model.perturbed(args.perturb, 99)
    for mbi in range(report["microbatches"]):
        ref = got[(0, 0, 0)][mbi]
        sids = ref.sample_ids
        cu = ref.cu_seqlens.cpu().tolist()
        cup = ref.cu_seqlens_padded.cpu().tolist()
        lengths = [cu[j + 1] - cu[j] for j in range(len(sids))]
        padded = [cup[j + 1] - cup[j] for j in range(len(sids))]
        total = sum(padded)
        layer_order = []
        for s in range(pp):
            layer_order += got[(0, 0, s)][mbi].replay_layers
        assert layer_order == model.moe_layers, layer_order
        tokens = torch.zeros(total, dtype=torch.int32, device=device)
        ids = torch.zeros(M, total, K, dtype=torch.int64, device=device)
        mask = torch.zeros(total, dtype=torch.uint8, device=device)
        for r in range(cp):
            local_tokens = got[(r, 0, 0)][mbi].tokens
            # SP: router rows of tp rank t are local rows [t*T/tp, (t+1)*T/tp).
            local_ids = torch.cat([torch.cat([got[(r, t, s)][mbi].replay_indices for s in range(pp)], 0)
                                   for t in range(tp)], 1)
            local_mask = torch.cat([got[(r, t, 0)][mbi].replay_mask for t in range(tp)], 0)
            pos = unzigzag_positions(padded, cp, r)
            glob = torch.tensor([cup[j] + q for j in range(len(sids)) for q in pos[j]],
                                dtype=torch.long, device=device)
            assert glob.numel() == local_tokens.numel() == local_mask.numel()
            tokens[glob] = local_tokens
            ids[:, glob] = local_ids
            mask[glob] = local_mask
            # Token field (last stage) vs the float32 we sent.
            lp_local = got[(r, 0, pp - 1)][mbi].token_fields["logprobs"]
            for j, sid in enumerate(sids):
                want = torch.zeros(padded[j], dtype=torch.float32)
                want[:lengths[j]] = by_id[sid]["logp"].float()
                q = torch.tensor(pos[j])
                off = sum(padded[:j]) // cp
                stats["logprob_field_mismatches"] += int(
                    (lp_local[off:off + len(pos[j])].cpu() != want[q]).sum())
        # Delivered ids vs recorded ids, every real row with mask 1.
        seg_id = torch.cat([torch.full((p,), j, dtype=torch.long) for j, p in enumerate(padded)]).to(device)
        seg_pos = torch.cat([torch.arange(p) for p in padded]).to(device)
        for j, sid in enumerate(sids):
            s = by_id[sid]
            n = lengths[j]
            assert torch.equal(tokens[cup[j]:cup[j] + n].cpu(), s["tokens"]), sid
            m = mask[cup[j]:cup[j] + n].bool().cpu()
            assert bool(m[:n - 1].all()) and not bool(m[n - 1]), "mask of %s" % sid
            rec = s["ids"].permute(1, 0, 2).to(device)  # [M, n-1, K]
            stats["delivered_rows_checked"] += (n - 1) * M
            stats["delivered_mismatches"] += int((ids[:, cup[j]:cup[j] + n - 1] != rec).any(-1).sum())

        real = torch.zeros(total, dtype=torch.bool, device=device)
        for j in range(len(sids)):
            real[cup[j] + 1:cup[j] + lengths[j]] = True  # positions with a log-prob
        want_lp = torch.zeros(total, dtype=DT, device=device)
        for j, sid in enumerate(sids):
            want_lp[cup[j]:cup[j] + lengths[j]] = by_id[sid]["logp"].to(device)
        nxt = torch.zeros(total, dtype=torch.long, device=device)
        nxt[:-1] = tokens[1:].long()

        def run(m, replay):
            used = {}

            def route(l, logits):
                x = ids[model.moe_layers.index(l)] if replay else logits.topk(K, dim=-1).indices
                used[l] = x
                return x
            logp, rl = m.forward(tokens, seg_id, seg_pos, route)
            lp = torch.zeros(total, dtype=DT, device=device)
            lp[1:] = logp[:-1].gather(1, nxt[:-1].unsqueeze(1)).squeeze(1)
            live = torch.stack([rl[l] for l in model.moe_layers])
            used_ids = torch.stack([used[l] for l in model.moe_layers])
            return (lp - want_lp)[real].abs(), live, used_ids

        d, live, _ = run(model, True)
        res["replay"].append(rollpack.routing_agreement(live, ids, mask=mask))
        dlp["replay"].append(d)
        d, live, used = run(perturbed, False)
        res["noreplay_perturbed"].append(rollpack.routing_agreement(live, ids, mask=mask))
        dlp["noreplay_perturbed"].append(d)
        d, live, used = run(perturbed, True)
        res["replay_perturbed"].append(rollpack.routing_agreement(live, ids, mask=mask))
        res["replay_used_perturbed"].append(rollpack.routing_agreement(used, ids, mask=mask))
        dlp["replay_perturbed"].append(d)

    def agg(lst):
        n = sum(int(a.rows_counted.sum()) for a in lst)
        differ = sum(int(a.rows_differ.sum()) for a in lst)
        overlap = sum(int(a.overlap_sum.sum()) for a in lst)
        return {"rows": n, "agreement": 1 - differ / n, "mean_overlap": overlap / (n * K)}

    report.update(stats)
    report["agreement"] = {k: agg(v) for k, v in res.items()}
    report["logprob_abs_diff"] = {k: {"max": float(torch.cat(v).max()),
                                      "mean": float(torch.cat(v).mean())} for k, v in dlp.items()}
    report["perturbation_rel_std"] = args.perturb
    report["rollout_s"] = round(t_rollout, 2)
    report["total_s"] = round(time.time() - t0, 2)
    a = report["agreement"]
    checks = {
        "delivered_ids_equal_recorded": stats["delivered_mismatches"] == 0 and stats["delivered_rows_checked"] > 0,
        "logprob_field_exact": stats["logprob_field_mismatches"] == 0,
        "replay_agreement_is_1": a["replay"]["agreement"] == 1.0,
        "replay_logprobs_identical": report["logprob_abs_diff"]["replay"]["max"] <= args.tol,
        "replayed_routing_used_is_1": a["replay_used_perturbed"]["agreement"] == 1.0,
        "noreplay_agreement_lower": a["noreplay_perturbed"]["agreement"] < 1.0,
    }
    report["checks"] = checks
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
