#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora under fuzz/corpus/ (deterministic).

Needs Python modules generated from proto/ (protoc --python_out=DIR) on
PYTHONPATH:  protoc --proto_path=proto --python_out=/tmp/pygen proto/rollpack/v1/*.proto
             PYTHONPATH=/tmp/pygen /usr/bin/python3 fuzz/make_seeds.py
"""
import os
import random
import struct

from rollpack.v1 import member_pb2, rollouts_pb2, ndarray_pb2, scheduler_pb2

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
rng = random.Random(8)


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def array(dtype, shape, fmt, values):
    a = ndarray_pb2.NDArray(dtype=dtype, shape=shape)
    a.data = struct.pack("<%d%s" % (len(values), fmt), *values)
    return a


def sample(model, n, form):
    # model 0: E=8 K=2 L=4 all MoE; 1: E=300 K=2 M={1,3}; 2: dense.
    s = rollouts_pb2.Sample(sample_id="s%d" % n, group_id="g", policy_version=3)
    s.tokens.CopyFrom(array(ndarray_pb2.INT32, [n], "i", [rng.randrange(1000) for _ in range(n)]))
    s.token_fields["logprobs"].CopyFrom(array(ndarray_pb2.FLOAT32, [n], "f", [-0.5] * n))
    s.scalars["reward"] = 1.0
    if model == 2:
        return s
    e, layers = (8, 4) if model == 0 else (300, 4 if form == "full" else 2)
    rows = n - 1 if form == "full" else n
    vals = []
    for r in range(rows):
        for _ in range(layers):
            ids = rng.sample(range(e), 2)
            if form == "missing" and r == 1:
                ids = [-1, -1]
            vals += ids
    if form == "full" or form == "missing":
        s.routed_experts.CopyFrom(array(ndarray_pb2.INT32, [rows, layers, 2], "i", vals))
    else:
        dt, fmt = (ndarray_pb2.UINT8, "B") if e <= 256 else (ndarray_pb2.UINT16, "H")
        s.routed_experts.CopyFrom(array(dt, [rows, layers, 2], fmt, vals))
    return s


i = 0
for model in (0, 1, 2):
    for form in ("full", "compact", "missing"):
        for n in (1, 3, 17):
            if form == "missing" and n < 3:
                continue
            write("sample_validation", "seed_%02d" % i, bytes([model]) + sample(model, n, form).SerializeToString())
            i += 1

for j in range(12):
    t = scheduler_pb2.Topology(dp=rng.choice([1, 2, 4]), cp=rng.choice([0, 1, 2, 4]), tp=rng.choice([0, 1, 2]),
                               pp=rng.choice([0, 1, 2, 4]), vpp=rng.choice([0, 1, 2]),
                               max_tokens_per_rank=rng.choice([512, 1024, 4096]), pad_multiple=rng.choice([0, 1, 8]),
                               scheduler=rng.choice([0, 1]), min_cp=rng.choice([0, 1, 2]))
    if j % 3 == 0:
        t.sequence_parallel = False
    if j % 4 == 1:
        t.num_layers_in_first_pipeline_stage = 1
        t.num_layers_in_last_pipeline_stage = 1
    if j % 5 == 2:
        t.cost.hidden_size = 4096
    # FuzzedDataProvider takes integers from the end: the model follows the proto bytes.
    write("topology", "seed_%02d" % j, t.SerializeToString() + bytes(rng.randrange(256) for _ in range(12)))

for target in ("plan", "layout"):
    for j in range(16):
        write(target, "seed_%02d" % j, bytes(rng.randrange(256) for _ in range(rng.choice([32, 64, 200, 400]))))

# received_microbatch: Microbatch bytes, then the slice cut points and piece
# count (FuzzedDataProvider takes integers from the end of the input).
from rollpack.v1 import trainer_pb2  # noqa: E402

for j in range(4):
    n = 1 + rng.randrange(40)
    m = trainer_pb2.Microbatch(step_id="step", index=j, num_microbatches=4, local_cp_size=1,
                               max_seqlen=n, workload=1.5)
    m.sample_ids.extend(["s1", "s2"])
    m.cu_seqlens.CopyFrom(array(ndarray_pb2.INT32, [3], "i", [0, n // 2, n]))
    m.cu_seqlens_padded.CopyFrom(array(ndarray_pb2.INT32, [3], "i", [0, n // 2, n]))
    m.tokens.CopyFrom(array(ndarray_pb2.INT32, [n], "i", [rng.randrange(1000) for _ in range(n)]))
    m.token_fields["logprobs"].CopyFrom(array(ndarray_pb2.FLOAT32, [n], "f", [-0.5] * n))
    m.replay_experts.CopyFrom(array(ndarray_pb2.UINT8, [n, 2, 2], "B",
                                    [rng.randrange(8) for _ in range(4 * n)]))
    m.replay_mask.CopyFrom(array(ndarray_pb2.UINT8, [n], "B", [1] * n))
    m.replay_layers.extend([1, 3])
    write("received_microbatch", "seed_%02d" % j,
          m.SerializeToString() + bytes(rng.randrange(256) for _ in range(2 * j + 1)))

# received_microbatch with ragged token fields (layout.md section 13): a
# uint16 and an int32 field, some rows empty. Its own generator, so the seeds
# above stay as they were.
ragged_rng = random.Random(13)
for j in range(3):
    n = 1 + ragged_rng.randrange(30)
    m = trainer_pb2.Microbatch(step_id="step", index=j, num_microbatches=3, local_cp_size=1,
                               max_seqlen=n)
    m.sample_ids.append("s1")
    m.tokens.CopyFrom(array(ndarray_pb2.INT32, [n], "i", [ragged_rng.randrange(1000) for _ in range(n)]))
    for name, dtype, fmt in (("sampling_mask", ndarray_pb2.UINT16, "H"), ("kept", ndarray_pb2.INT32, "i")):
        offsets = [0]
        for _ in range(n):
            offsets.append(offsets[-1] + ragged_rng.choice([0, 0, 1, 3, 6]))
        r = m.ragged_token_fields[name]
        r.values.CopyFrom(array(dtype, [offsets[-1]], fmt,
                                [ragged_rng.randrange(60000) for _ in range(offsets[-1])]))
        r.offsets.CopyFrom(array(ndarray_pb2.INT64, [n + 1], "q", offsets))
    write("received_microbatch", "seed_ragged_%02d" % j,
          m.SerializeToString() + bytes(ragged_rng.randrange(256) for _ in range(2 * j + 1)))

# sample_validation model 3 (N=4, M={1,3}, E=8, K=2, one MTP layer with
# mtp_routing, layout.md section 10): full [rows, 5, 2] and compact [rows, 3, 2]
# payloads. Its own generator, so the seeds above stay as they were.
mtp_rng = random.Random(22)
for j, (form, n) in enumerate([(f, n) for f in ("full", "compact", "missing") for n in (1, 3, 17)]):
    if form == "missing" and n < 3:
        continue
    s = rollouts_pb2.Sample(sample_id="mtp%d" % n, group_id="g", policy_version=3)
    s.tokens.CopyFrom(array(ndarray_pb2.INT32, [n], "i", [mtp_rng.randrange(1000) for _ in range(n)]))
    layers = 5 if form != "compact" else 3
    rows = n - 1 if form != "compact" else n
    vals = []
    for r in range(rows):
        for _ in range(layers):
            vals += [-1, -1] if form == "missing" and r == 1 else mtp_rng.sample(range(8), 2)
    if form == "compact":
        s.routed_experts.CopyFrom(array(ndarray_pb2.UINT8, [rows, layers, 2], "B", vals))
    else:
        s.routed_experts.CopyFrom(array(ndarray_pb2.INT32, [rows, layers, 2], "i", vals))
    write("sample_validation", "seed_mtp_%02d" % j, bytes([3]) + s.SerializeToString())

# step_record: ClusterStepRecords as a planner writes them (etcd), over
# 1 to 3 members, several topologies, MoE and dense models, one RECOMPUTE.
# Its own generator, so the seeds above stay as they were.
record_rng = random.Random(36)
for j, (dp, cp, tp, pp, experts, count) in enumerate(
        [(1, 1, 1, 1, 8, 3), (2, 1, 1, 1, 8, 6), (2, 2, 1, 2, 16, 12), (1, 2, 2, 1, 300, 5),
         (2, 1, 2, 2, 0, 8), (1, 1, 1, 2, 64, 4)]):
    r = member_pb2.ClusterStepRecord(step_id="step-%d" % j, pool="pool")
    r.topology.dp, r.topology.cp, r.topology.tp, r.topology.pp = dp, cp, tp, pp
    r.topology.max_tokens_per_rank = 256
    r.topology.scheduler = scheduler_pb2.DYNAMIC_CP if j % 2 else scheduler_pb2.STATIC_CP
    r.model.name, r.model.num_layers = "moe", 4
    if experts:
        r.model.num_experts, r.model.topk = experts, 2
    members = ["127.0.0.1:%d" % (50051 + m) for m in range(1 + j % 3)]
    r.members.extend(members)
    for i in range(count):
        r.sample_ids.append("m%d-rollout-%d" % (i % len(members), i))
        r.num_tokens.append(record_rng.randrange(1, 200))
        r.owner.append(i % len(members))
    r.coordinator = members[0]
    r.created_unix_nanos = 1700000000000000000 + j
    if j == 5:
        r.replay_source = scheduler_pb2.REPLAY_SOURCE_RECOMPUTE
    write("step_record", "seed_%02d" % j, r.SerializeToString())

# member_service: calls of the Member RPCs on a member that stores s0..s7 in
# pool "p" (MoE, E=8 K=2 L=4; s0, s1 in its live step L1; s4, s5 held for
# cluster step c1 of attempt 1700000000000000001 with o1, o2 on another
# member; s2, s3 free with recompute routing; s6, s7 of the incomplete group
# g3) and d0, d1 in the dense pool "d" (fuzz/member_service_fuzzer.cc).
# Each call: [selector][length, 2 bytes little endian][request]. Selectors:
# 0 ListFreeSamples, 1 HoldSamples, 2 ConfirmHold, 3 DropHold, 4 ReleaseHold,
# 5 DropGroups, 6 ReadSamples, 7 StageRouting, 8 CheckRouting,
# 9 CommitRouting, 10-12 the owner's R2 stage, check and commit; +0x80: a
# member with mutual TLS, called without a member certificate.
# Its own generator, so the seeds above stay as they were.
member_rng = random.Random(361)
C1 = 1700000000000000001
OTHER = "127.0.0.1:50052"


def call(selector, message):
    data = message.SerializeToString()
    return bytes([selector]) + struct.pack("<H", len(data)) + data


def list_free(**kw):
    return member_pb2.ListFreeSamplesRequest(**kw)


def hold(step, pool, ids, attempt, **kw):
    return member_pb2.HoldSamplesRequest(step_id=step, pool=pool, sample_ids=ids, coordinator=OTHER,
                                         attempt=attempt, **kw)


def step_hold(step, attempt=0):
    return member_pb2.StepHoldRequest(step_id=step, attempt=attempt)


def read(step, ids):
    return member_pb2.ReadSamplesRequest(step_id=step, sample_ids=ids)


def stage(step, attempt, rows, uploaded_rows, index=0, dtype=ndarray_pb2.UINT8, fmt="B"):
    r = member_pb2.StageRoutingRequest(attempt=attempt, uploaded_rows=uploaded_rows)
    r.routing.step_id = step
    r.routing.index = index
    ids = []
    for _ in range(rows * 4):
        ids += member_rng.sample(range(8), 2)  # distinct within a (token, layer)
    r.routing.experts.CopyFrom(array(dtype, [rows, 4, 2], fmt, ids))
    return r


def routing(step, attempt):
    return member_pb2.MemberRoutingRequest(step_id=step, attempt=attempt)


member_seeds = {
    "list": [call(0, list_free(pool="p", limit=10)), call(0, list_free(pool="p", all_with_metadata=True)),
             call(0, list_free(pool="p", sample_ids=["s0", "s2", "s4", "s9"])),
             call(0, list_free(pool="d", limit=1)), call(0, list_free(pool="nope"))],
    "hold_read_release": [call(1, hold("h1", "p", ["s6", "s7"], 5)), call(2, step_hold("h1")),
                          call(6, read("h1", ["s7", "s6"])), call(3, step_hold("h1", 4)),
                          call(4, step_hold("h1")), call(0, list_free(pool="p", limit=-1))],
    "hold_drop": [call(1, hold("h1", "p", ["s2", "s6"], 6)), call(3, step_hold("h1", 6)),
                  call(1, hold("h2", "p", ["s2", "s6"], 7)), call(0, list_free(pool="p", all_with_metadata=True))],
    "recompute_hold": [call(1, hold("h2", "p", ["s2", "s3"], 7, reuse_samples=True,
                                    replay_source=scheduler_pb2.REPLAY_SOURCE_RECOMPUTE)),
                       call(6, read("h2", ["s3", "s2"])), call(4, step_hold("h2")),
                       call(1, hold("h3", "p", ["s6"], 8, replay_source=scheduler_pb2.REPLAY_SOURCE_RECOMPUTE)),
                       call(0, list_free(pool="p", sample_ids=["s2", "s3"]))],
    "read_c1": [call(6, read("c1", ["s4", "s5"])), call(6, read("c1", ["s5"])), call(6, read("c1", ["s0"])),
                call(6, read("L1", ["s0"])), call(6, read("c1", []))],
    "conflicts": [call(1, hold("h3", "p", ["s0"], 1)), call(1, hold("L1", "p", ["s6"], 1)),
                  call(1, hold("c1", "p", ["s6"], C1)), call(1, hold("h4", "p", ["s6", "nope"], 2)),
                  call(1, hold("h5", "d", ["d0", "d1"], 3)), call(1, hold("h6", "p", ["s6", "s6"], 4)),
                  call(2, step_hold("nope")), call(3, step_hold("c1", 1))],
    "drop_groups": [call(5, member_pb2.DropGroupsRequest(pool="p", group_ids=["g3"])),
                    call(5, member_pb2.DropGroupsRequest(pool="p", group_ids=["g0", "g1", "g2", "g3"])),
                    call(5, member_pb2.DropGroupsRequest(pool="d", group_ids=[""])),
                    call(0, list_free(pool="p", all_with_metadata=True))],
    "routing_handlers": [call(7, stage("c1", C1, 11, 22)), call(8, routing("c1", C1)), call(9, routing("c1", C1))],
    "stage_c1": [call(10, stage("c1", C1, 11, 22)), call(11, routing("c1", C1)), call(12, routing("c1", C1)),
                 call(12, routing("c1", C1)), call(6, read("c1", ["s4", "s5"])), call(4, step_hold("c1"))],
    "stage_int32": [call(10, stage("c1", C1, 11, 22, dtype=ndarray_pb2.INT32, fmt="i")),
                    call(10, stage("c1", C1, 11, 22, index=1)), call(11, routing("c1", C1))],
    "stage_new_hold": [call(1, hold("h6", "p", ["s6", "s7"], 9, reuse_samples=True)),
                       call(10, stage("h6", 9, 16, 19)), call(11, routing("h6", 9)), call(12, routing("h6", 9)),
                       call(4, step_hold("h6")),
                       call(1, hold("h7", "p", ["s6", "s7"], 11, replay_source=scheduler_pb2.REPLAY_SOURCE_RECOMPUTE)),
                       call(6, read("h7", ["s6", "s7"]))],
    "stage_dense": [call(1, hold("h8", "d", ["d0", "d1"], 3)), call(10, stage("h8", 3, 13, 16)),
                    call(12, routing("h8", 3))],
    "mtls": [call(0x80, list_free(pool="p", limit=10)), call(0x81, hold("h1", "p", ["s6"], 5)),
             call(0x84, step_hold("c1")), call(0x86, read("c1", ["s4"])), call(0x85,
             member_pb2.DropGroupsRequest(pool="p", group_ids=["g3"])), call(0x89, routing("c1", C1))],
    "release_by_name": [call(4, step_hold("L1")), call(4, step_hold("c1")), call(3, step_hold("c1")),
                        call(0, list_free(pool="p", all_with_metadata=True))],
}
for name, calls in member_seeds.items():
    write("member_service", "seed_" + name, b"".join(calls))
