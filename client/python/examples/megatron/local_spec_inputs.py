"""A rollpack micro-batch as the inputs of a Megatron-core GPTModel built with
the local layer spec (no Transformer Engine), on any device, without
megatron imported (CI checks this file on CPU).

rollpack delivers THD micro-batches: sequences packed back to back, each
padded to a multiple of the sequence-parallel size (layout.md section 2),
described by ``cu_seqlens`` (real lengths) and ``cu_seqlens_padded``. The
local spec's DotProductAttention takes no ``PackedSeqParams`` (THD needs
Transformer Engine's or another varlen backend), but it takes any boolean
mask. So a micro-batch becomes ONE row of a BSHD batch:

* ``input_ids`` / ``position_ids``: [1, T] with T = cu_seqlens_padded[-1];
  positions restart at 0 at each sequence;
* ``attention_mask``: [1, 1, T, T] bool, True = masked: causal within each
  sequence's padded block, nothing across blocks, so packed position i sees
  exactly what it saw in the rollout's own forward of its sequence;
* ``labels``: [1, T], the next token within the same sequence (0 where
  there is none: a sequence's last real token and its padding, masked).

Replay target rows: with batch 1, Megatron's router input is the
[S, 1, H] hidden reshaped to [S, H], and with sequence parallelism TP rank t
holds the contiguous slice S/tp * t .. S/tp * (t + 1) (the scatter along the
sequence dimension). rollpack's router rows for that rank are the same
slice (layout.md section 5), so router row r of TP rank t follows packed
token ``T // tp * t + r`` (``router_row_positions``), and
``mb.replay_indices[l]`` is installed as is: no reordering.
"""

from typing import Dict, List, Optional

import torch


def seq_bounds(cu_seqlens_padded: torch.Tensor) -> List[int]:
    """cu_seqlens_padded as Python ints, checked: starts at 0, non-decreasing."""
    cu = [int(x) for x in cu_seqlens_padded.reshape(-1).tolist()]
    if not cu or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError("cu_seqlens_padded must start at 0 and not decrease, got %s" % cu[:8])
    return cu


def sequence_index(cu_seqlens_padded: torch.Tensor) -> torch.Tensor:
    """int64 [T]: the sequence each packed position belongs to."""
    cu = cu_seqlens_padded.long()
    lengths = cu[1:] - cu[:-1]
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device), lengths)


def position_ids(cu_seqlens_padded: torch.Tensor) -> torch.Tensor:
    """int64 [1, T]: position within its own sequence."""
    cu = cu_seqlens_padded.long()
    seq = sequence_index(cu)
    return (torch.arange(seq.numel(), device=cu.device) - cu[:-1][seq]).unsqueeze(0)


def block_causal_mask(cu_seqlens_padded: torch.Tensor) -> torch.Tensor:
    """bool [1, 1, T, T], True where query i must not see key j: j > i, or j
    in another sequence (Megatron's attention_mask_func convention)."""
    seq = sequence_index(cu_seqlens_padded)
    t = seq.numel()
    i = torch.arange(t, device=seq.device)
    allowed = (seq.unsqueeze(1) == seq.unsqueeze(0)) & (i.unsqueeze(0) <= i.unsqueeze(1))
    return (~allowed).view(1, 1, t, t)


def next_token_labels(tokens: torch.Tensor, cu_seqlens: torch.Tensor,
                      cu_seqlens_padded: torch.Tensor) -> torch.Tensor:
    """int64 [1, T]: labels[i] = tokens[i + 1] when i + 1 is a real token of
    the same sequence, else 0 (a position the loss mask drops)."""
    tokens = tokens.reshape(-1).long()
    cu, cup = cu_seqlens.long(), cu_seqlens_padded.long()
    if tokens.numel() != int(cup[-1]):
        raise ValueError("tokens has %d entries, cu_seqlens_padded ends at %d"
                         % (tokens.numel(), int(cup[-1])))
    seq = sequence_index(cup)
    pos = torch.arange(tokens.numel(), device=tokens.device) - cup[:-1][seq]
    real = cu[1:] - cu[:-1]
    has_next = pos + 1 < real[seq]
    nxt = torch.zeros_like(tokens)
    nxt[:-1] = tokens[1:]
    return torch.where(has_next, nxt, torch.zeros_like(nxt)).unsqueeze(0)


def token_logprobs(next_logprobs: torch.Tensor, cu_seqlens_padded: torch.Tensor) -> torch.Tensor:
    """[T]: the log-probability of token i given the tokens before it, from
    the model's per-position next-token log-probabilities (-loss of
    ``labels``): out[i] = next_logprobs[i - 1] inside a sequence, 0 at each
    sequence's first position (nothing predicts it). This is the layout the
    rollout stores in the ``logprobs`` token field."""
    nlp = next_logprobs.reshape(-1)
    pos = position_ids(cu_seqlens_padded).reshape(-1)
    out = torch.zeros_like(nlp)
    out[1:] = nlp[:-1]
    return torch.where(pos > 0, out, torch.zeros_like(out))


def router_row_positions(num_tokens: int, tp_size: int, tp_rank: int,
                         sequence_parallel: bool) -> torch.Tensor:
    """int64 [rows]: the packed position each of the rank's router rows
    (and replay target rows) follows."""
    if not sequence_parallel or tp_size == 1:
        return torch.arange(num_tokens)
    if num_tokens % tp_size:
        raise ValueError("sequence parallel: %d packed tokens do not split over tp=%d "
                         "(rollpack pads each sequence to a multiple of tp)"
                         % (num_tokens, tp_size))
    rows = num_tokens // tp_size
    return torch.arange(tp_rank * rows, (tp_rank + 1) * rows)


def replay_targets(mb, num_tokens: int, tp_size: int, sequence_parallel: bool
                   ) -> List[torch.Tensor]:
    """The micro-batch's per-layer [rows, K] int64 targets for this rank's
    routers (Megatron gathers with int64), rows checked against the packed
    length: rows must be T (no SP) or T / tp (SP)."""
    rows = num_tokens // tp_size if sequence_parallel and tp_size > 1 else num_tokens
    ids = mb.replay_indices
    if ids.dim() != 3 or ids.shape[0] != len(mb.replay_layers) or ids.shape[1] != rows:
        raise ValueError("replay_indices %s: want [%d layers, %d rows, K] for %d packed tokens, "
                         "tp=%d, sequence_parallel=%s" % (tuple(ids.shape), len(mb.replay_layers),
                                                          rows, num_tokens, tp_size,
                                                          sequence_parallel))
    return [t.long() for t in ids.unbind(0)]


def model_inputs(mb, *, tp_size: int, sequence_parallel: bool,
                 first_stage: bool, last_stage: bool) -> Dict[str, Optional[torch.Tensor]]:
    """GPTModel.forward's arguments for one micro-batch on this rank, plus
    what the loss needs. input_ids / position_ids on the first stage, labels
    and the rollout's per-token ``old_logprobs`` / ``loss_mask`` on the last
    (the last stage needs ``mb.tokens`` for labels: fetch with all_fields);
    the attention mask everywhere (every layer attends)."""
    if mb.local_cp_size != 1:
        raise ValueError("local_cp_size=%d: context parallelism needs Transformer Engine's "
                         "attention, which the local spec does not have" % mb.local_cp_size)
    cup = mb.cu_seqlens_padded.long()
    t = seq_bounds(cup)[-1]
    out: Dict[str, Optional[torch.Tensor]] = {
        "attention_mask": block_causal_mask(cup), "input_ids": None, "position_ids": None,
        "labels": None, "old_logprobs": None, "loss_mask": None, "num_tokens": t,
        "cu_seqlens_padded": cup}
    if first_stage or last_stage:
        if mb.tokens.numel() != t:
            raise ValueError("micro-batch %d has %d tokens on this stage, cu_seqlens_padded "
                             "ends at %d (the last stage needs all_fields=True)"
                             % (mb.index, mb.tokens.numel(), t))
    if first_stage:
        out["input_ids"] = mb.tokens.reshape(1, -1).long()
        out["position_ids"] = position_ids(cup)
    if last_stage:
        out["labels"] = next_token_labels(mb.tokens, mb.cu_seqlens, cup)
        out["old_logprobs"] = mb.token_fields["logprobs"].reshape(-1).float()
        out["loss_mask"] = mb.token_fields["loss_mask"].reshape(-1).float()
    out["replay_targets"] = replay_targets(mb, t, tp_size, sequence_parallel)
    return out
