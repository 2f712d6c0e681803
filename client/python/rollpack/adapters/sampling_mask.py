"""Sampling masks: the token ids an engine's sampler kept (after top-k,
top-p, min-p) at each generated position, as the ``(values, offsets)`` of a
sample's ragged token field ``sampling_mask`` (layout.md section 13).

The engines return one list per generated token; the sample has one list
per token, prompt included, so both adapters put empty lists on the prompt
tokens (the sampler chose none of them) and the engine's lists on the
generated ones, which are the last tokens of ``tokens``. With the tokens at
hand, each generated token must be in its own list (it was sampled from it;
an empty list is allowed and checked for nothing): this catches a mask that
belongs to another choice or is shifted by one.

Formats (read 2026-11):

* vLLM ("Mask Replay", vllm-project/vllm PR 49577; engine flag
  ``--return-sampling-mask``, offline ``LLM(..., return_sampling_mask=True)``,
  requests with ``0 < top_k``): ``CompletionOutput.sampling_mask``, first a
  CSR ``SamplingMask(token_ids, offsets)`` (flat ids, offsets [G + 1]), in
  later releases ``SamplingMask(token_ids)`` with one list per generated
  token. Over HTTP, ``choices[i].sampling_mask`` (lists) of
  ``/inference/v1/generate`` (streamed: each event's lists for its tokens).
* SGLang (sgl-project/sglang PRs 27408 and 33593): the request's
  ``return_sampling_mask: true`` (on ``/v1/chat/completions`` with
  ``return_meta_info: true``; not with ``stream``) answers
  ``meta_info.output_token_sampling_mask`` (one list per output id), beside
  ``output_token_sampling_logprobs`` (the sampled token's log-probability
  renormalized over its list) and ``output_token_sampling_mask_length``.
* prime-rl's transport, ``SamplingMask(ids, counts)`` (flat int32 ids and
  each token's count), is read as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Union

import numpy as np
from numpy.typing import ArrayLike

from rollpack import ragged as _rg
from rollpack.errors import PayloadError
from rollpack.ragged import Ragged
from rollpack.sample import as_tokens

Tokens = Union[ArrayLike, int]


def _is_lists(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(r, (list, tuple, np.ndarray))
                                                for r in x)


def _lists_or_csr(mask: Any, what: str) -> Ragged:
    """The engine's lists of one choice, in any of the forms the module doc names."""
    if isinstance(mask, Ragged):
        return _rg.as_ragged(mask, mask.num_tokens, what)
    if isinstance(mask, Mapping):
        if "token_ids" in mask and "offsets" in mask:
            offsets = np.asarray(mask["offsets"])
            return _rg.as_ragged((mask["token_ids"], offsets), offsets.shape[0] - 1, what)
        raise PayloadError("%s is a mapping without \"token_ids\" and \"offsets\"" % what)
    if hasattr(mask, "ids") and hasattr(mask, "counts"):  # prime-rl
        return _rg.from_counts(mask.ids, mask.counts, what)
    if hasattr(mask, "token_ids"):  # vLLM SamplingMask
        offsets = getattr(mask, "offsets", None)
        if offsets is not None:
            offsets = np.asarray(offsets)
            return _rg.as_ragged((mask.token_ids, offsets), offsets.shape[0] - 1, what)
        mask = mask.token_ids
    if isinstance(mask, np.ndarray) and mask.ndim == 2:  # equal-length lists
        mask = list(mask)
    if not _is_lists(mask):
        raise PayloadError("%s must be one list of token ids per generated token, got %s"
                           % (what, type(mask).__name__))
    return _rg.from_lists(mask, what)


def _place(lists: Ragged, tokens: Tokens, generated: Optional[Any], what: str,
           check_sampled: bool) -> Ragged:
    """The engine's G lists as the last G tokens' of n; empty lists before."""
    g = lists.num_tokens
    ids = None
    if isinstance(tokens, (int, np.integer)):
        n = int(tokens)
    else:
        ids = as_tokens(tokens)
        n = int(ids.shape[0])
    if g > n:
        raise PayloadError("%s has %d lists (one per generated token) but the sample has %d "
                           "tokens" % (what, g, n))
    if generated is not None:
        gen = as_tokens(generated)
        if gen.shape[0] != g:
            raise PayloadError("%s has %d lists for %d generated tokens"
                               % (what, g, gen.shape[0]))
        if ids is not None and not np.array_equal(ids[n - g:], gen):
            raise PayloadError("%s: the sample's last %d tokens are not the generated ones"
                               % (what, g))
    if check_sampled and ids is not None and lists.values.size:
        counts = lists.counts()
        sampled = np.repeat(ids[n - g:].astype(np.int64), counts)
        hits = np.zeros(g + 1, dtype=np.int64)
        np.add.at(hits, np.repeat(np.arange(g), counts),
                  lists.values.astype(np.int64) == sampled)
        missing = np.flatnonzero((hits[:g] == 0) & (counts > 0))
        if missing.size:
            j = int(missing[0])
            raise PayloadError("%s: generated token %d (position %d, id %d) is not in its own "
                               "list of kept ids: the mask is not this sequence's"
                               % (what, j, n - g + j, int(ids[n - g + j])))
    return _rg.prepend_empty(lists, n - g)


def from_vllm_sampling_mask(output: Any, tokens: Tokens, *,
                            check_sampled: bool = True) -> Ragged:
    """vLLM's sampling mask of one sequence as the sample's
    ``ragged_token_fields["sampling_mask"]``: ``(values, offsets)`` over the n
    ``tokens`` (prompt + generated; or just n), empty lists on the prompt.

    ``output``: a RequestOutput (its first completion), a CompletionOutput
    (its ``sampling_mask``; its ``token_ids`` are checked against the end of
    ``tokens``), a ``SamplingMask`` (CSR ``token_ids``/``offsets``, or
    ``token_ids`` as lists), an HTTP choice dict (``choices[i]`` of
    ``/inference/v1/generate``: its ``sampling_mask``, its ``token_ids``
    checked), or the lists themselves. ``check_sampled``: each generated token
    must be in its own list. Raises PayloadError naming what does not fit.
    """
    what = "vLLM sampling_mask"
    generated = None
    if hasattr(output, "outputs") and not hasattr(output, "sampling_mask"):
        if not output.outputs:
            raise PayloadError("%s: the RequestOutput has no completions" % what)
        output = output.outputs[0]
    if hasattr(output, "sampling_mask"):
        generated = getattr(output, "token_ids", None)
        output = output.sampling_mask
    elif isinstance(output, Mapping) and "sampling_mask" in output:
        generated = output.get("token_ids")
        output = output["sampling_mask"]
    if output is None:
        raise PayloadError("%s is None: start vLLM with --return-sampling-mask "
                           "(LLM(..., return_sampling_mask=True)) and sample with top_k > 0"
                           % what)
    return _place(_lists_or_csr(output, what), tokens, generated, what, check_sampled)


def from_sglang_sampling_mask(output: Any, tokens: Tokens, *,
                              check_sampled: bool = True) -> Ragged:
    """SGLang's sampling mask of one sequence as the sample's
    ``ragged_token_fields["sampling_mask"]``: ``(values, offsets)`` over the n
    ``tokens`` (prompt + generated; or just n), empty lists on the prompt.

    ``output``: a ``/generate`` item (``{"output_ids", "meta_info"}``: its
    ``output_ids`` are checked against the end of ``tokens``), a chat choice
    (``{"token_ids", "meta_info"}``), a ``meta_info`` dict, or the lists
    (``meta_info.output_token_sampling_mask``) themselves. The request must
    have asked ``return_sampling_mask: true`` (chat: with
    ``return_meta_info: true``). ``check_sampled``: each generated token must
    be in its own list. Raises PayloadError naming what does not fit.
    """
    what = "SGLang meta_info.output_token_sampling_mask"
    generated = None
    meta = output
    if isinstance(output, Mapping) and "meta_info" in output:
        generated = output.get("output_ids", output.get("token_ids"))
        meta = output["meta_info"]
    if isinstance(meta, Mapping):
        lists = meta.get("output_token_sampling_mask")
        length = meta.get("output_token_sampling_mask_length")
    else:
        lists, length = meta, None
    if lists is None:
        raise PayloadError("%s is missing: send the request with return_sampling_mask: true "
                           "(/v1/chat/completions: with return_meta_info: true) and top_k or "
                           "top_p set" % what)
    field = _lists_or_csr(lists, what)
    if length is not None and int(length) != field.num_tokens:
        raise PayloadError("%s has %d lists; output_token_sampling_mask_length says %d"
                           % (what, field.num_tokens, int(length)))
    return _place(field, tokens, generated, what, check_sampled)
