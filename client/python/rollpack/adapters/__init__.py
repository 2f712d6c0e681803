"""Adapters: routed experts as each inference engine returns them -> the
``(routed_experts, row_offset)`` pair of a :class:`rollpack.Sample`.

Every adapter takes the engine's payload, the sample's tokens (prompt +
response, ``n`` of them) and the :class:`rollpack.ModelSpec`, and returns a
:class:`RoutedExperts` named tuple ``(array, row_offset)``:

* ``array`` is [rows, L, K] with L = ``num_layers`` (full layout) or the
  number of MoE layers (compact layout), whichever the payload has; it is a
  view of the decoded bytes (``np.frombuffer``) or of the engine's array
  whenever the format allows, never a Python list.
* ``row_offset`` is the first token the rows cover.

Every adapter detects the layer axis (full vs compact), whether rows end at
``n`` or ``n - 1`` (engines never run the last sampled token through the
model) and the start offset, and refuses what does not fit with a
:class:`rollpack.errors.PayloadError` naming the numbers. Where an engine was
asked to start at ``s > 0`` (``routed_experts_prompt_start``,
``routed_experts_start_len``) but returned rows from token 0 (builds that
ignore the parameter), the row count tells, and the offset returned is 0.
When ``s = 1`` a payload of ``n - 1`` rows is read as "from 0" (what engines
that end at ``n - 1`` return), never as "from 1 to n".

Sampling masks (the token ids the sampler kept at each generated position)
have their own two adapters, :func:`from_vllm_sampling_mask` and
:func:`from_sglang_sampling_mask` (:mod:`~rollpack.adapters.sampling_mask`),
returning the ``(values, offsets)`` of a ragged token field.

One module per engine family: :mod:`~rollpack.adapters.vllm`,
:mod:`~rollpack.adapters.sglang`, :mod:`~rollpack.adapters.megatron`,
:mod:`~rollpack.adapters.trtllm` and :mod:`~rollpack.adapters.ndarray_dict`
(SkyRL, ms-swift); everything is re-exported here.
"""

from rollpack.adapters._common import RoutedExperts, parse_dtype
from rollpack.adapters.megatron import from_megatron_inference
from rollpack.adapters.ndarray_dict import from_ndarray_dict
from rollpack.adapters.sampling_mask import from_sglang_sampling_mask, from_vllm_sampling_mask
from rollpack.adapters.sglang import from_sglang_meta_info, from_sglang_turns
from rollpack.adapters.trtllm import from_trtllm_output
from rollpack.adapters.vllm import (decode_npy, from_vllm_choice, from_vllm_device_capture,
                                    from_vllm_output, from_vllm_v021_response)

__all__ = ["RoutedExperts", "from_vllm_output", "from_vllm_v021_response", "from_vllm_choice",
           "from_vllm_device_capture", "from_sglang_meta_info", "from_sglang_turns",
           "from_megatron_inference", "from_trtllm_output", "from_ndarray_dict", "decode_npy",
           "parse_dtype", "from_vllm_sampling_mask", "from_sglang_sampling_mask"]
