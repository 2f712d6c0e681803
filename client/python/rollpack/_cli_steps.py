"""`rollpack step show STEP`: one live step in detail (docs/operations.md,
"Controller"), where `step list` gives one row per step.

    rollpack step show STEP [--json] --server HOST:PORT ...

It reads the step's StepInfo (Scheduler.ListSteps with its id) and its plan
(Scheduler.GetPlan) and prints: pool, topology, samples, tokens and groups,
age and trainer streams, how the step was made (reuse, replay source,
advantage estimator), the MoE layers each pipeline stage replays
(stage_layers), in a cluster the members holding its samples, per rank the
micro-batches with tokens and the tokens over the step (the balance the
planner reached), and a picture of the plan: one line per micro-batch, one
character per rank of the data-parallel x context-parallel grid, how full
that rank's micro-batch is. `--json` prints {"step": StepInfo, "plan": Plan}.
"""

import json
import time

from rollpack import _cli_common

# How full a rank's micro-batch is, in tenths of max_tokens_per_rank: "."
# no tokens, "1".."9" up to nine tenths, "#" more.
_FILL = "123456789#"
# The picture's bounds: a step of thousands of micro-batches or ranks stays
# a screen; the rest is counted.
MAX_PICTURE_ROWS = 32
MAX_PICTURE_RANKS = 96


_age = _cli_common.age
_topology = _cli_common.topology


def _ranks(plan):
    """The data-parallel x context-parallel grid's size of one micro-batch."""
    t = plan.topology
    return max(1, t.dp) * max(1, t.cp)


def rank_tokens(plan):
    """Per rank of the DP x CP grid: (micro-batches with tokens, tokens),
    from each CP group's tokens_per_rank over the ranks it spans."""
    n = _ranks(plan)
    microbatches = [0] * n
    tokens = [0] * n
    for mb in plan.microbatches:
        for g in mb.groups:
            for r in range(g.first_rank, min(n, g.first_rank + max(1, g.cp_size))):
                if g.tokens_per_rank > 0:
                    microbatches[r] += 1
                tokens[r] += g.tokens_per_rank
    return microbatches, tokens


def picture(plan):
    """The plan as text: one line per micro-batch, one character per rank."""
    n = _ranks(plan)
    budget = plan.topology.max_tokens_per_rank
    shown = min(n, MAX_PICTURE_RANKS)
    lines = []
    width = len(str(max(0, len(plan.microbatches) - 1)))
    for i, mb in enumerate(plan.microbatches[:MAX_PICTURE_ROWS]):
        cells = ["."] * n
        for g in mb.groups:
            for r in range(g.first_rank, min(n, g.first_rank + max(1, g.cp_size))):
                if g.tokens_per_rank <= 0:
                    continue
                if budget <= 0:
                    cells[r] = "#"
                else:
                    tenth = min(len(_FILL) - 1, max(0, (g.tokens_per_rank * 10 - 1) // budget))
                    cells[r] = _FILL[tenth]
        more = " +%d ranks" % (n - shown) if n > shown else ""
        lines.append("  mb %s |%s|%s" % (str(i).rjust(width), "".join(cells[:shown]), more))
    if len(plan.microbatches) > MAX_PICTURE_ROWS:
        lines.append("  ... %d more micro-batches" % (len(plan.microbatches) - MAX_PICTURE_ROWS))
    return lines


_ADVANTAGE = {0: "none", 1: "grpo", 2: "grpo-mean", 3: "rloo"}


def show_lines(info, plan, now=None):
    """The detail view of one step: StepInfo `info` and its Plan `plan`."""
    now = time.time() if now is None else now
    st = plan.stats
    out = ["step %s" % info.step_id,
           "  pool          %s" % info.pool,
           "  topology      %s, %d tokens per rank" % (_topology(info.topology),
                                                       info.topology.max_tokens_per_rank),
           "  samples       %d (%d tokens, %d complete groups)" % (
               info.num_samples, info.num_tokens, info.num_groups),
           "  micro-batches %d per rank (lower bound %d), imbalance %.3f, padding %.1f%%" % (
               info.num_microbatches, st.min_microbatches, st.rank_imbalance,
               100 * st.padding_overhead),
           "  age           %s; trainer streams %d open / %d started here, last %s" % (
               _age(info.created_unix_nanos, now), info.streams_open, info.streams_started,
               _age(info.last_stream_unix_nanos, now) + " ago" if info.last_stream_unix_nanos
               else "never")]
    advantage = _ADVANTAGE.get(info.advantage, str(info.advantage))
    if info.advantage:
        advantage += " of %s" % (info.advantage_scalar or "reward")
    out.append("  made with     %s, replay %s, advantage %s" % (
        "reuse_samples (released samples go back to the free set)" if info.reuse_samples
        else "samples deleted at release",
        "recompute" if info.replay_source == 1 else "rollout", advantage))
    for s in info.stage_layers:
        out.append("  stage pp%-4d  layers %s, replays %s" % (
            s.pp_rank, list(s.layers) if s.layers else "-",
            list(s.replay_layers) if s.replay_layers else "-"))
    if info.holders:
        out.append("  held by       %d members" % len(info.holders))
        width = max(len(h.member) for h in info.holders)
        for h in info.holders:
            out.append("    %s  %d samples, %d tokens" % (h.member.ljust(width), h.num_samples,
                                                          h.num_tokens))
    microbatches, tokens = rank_tokens(plan)
    if tokens:
        mean = sum(tokens) / len(tokens)
        out.append("  per rank      micro-batches with tokens %d..%d; tokens %d..%d (mean %.0f, "
                   "max/mean %.3f)" % (min(microbatches), max(microbatches), min(tokens),
                                       max(tokens), mean, max(tokens) / mean if mean else 0.0))
        t = plan.topology
        cp = max(1, t.cp)
        for d in range(min(max(1, t.dp), MAX_PICTURE_RANKS)):
            row = range(d * cp, d * cp + cp)
            out.append("    dp%-4d %s" % (d, "  ".join(
                "cp%d: %d mbs %d tok" % (r - d * cp, microbatches[r], tokens[r]) for r in row)))
    out.append("  plan          one line per micro-batch, one character per dp x cp rank "
               "(tenths of max_tokens_per_rank: 1-9, # full, . none)")
    out.extend(picture(plan))
    return out


def run_show(controller, step_id, as_json):
    """`rollpack step show STEP`."""
    info = controller.step(step_id)
    plan = controller.plan(step_id)
    if as_json:
        from google.protobuf import json_format
        print(json.dumps({"step": json_format.MessageToDict(info, preserving_proto_field_name=True),
                          "plan": json_format.MessageToDict(plan, preserving_proto_field_name=True)}))
    else:
        print("\n".join(show_lines(info, plan)))
    return 0
