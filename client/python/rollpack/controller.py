"""Controller: what a training loop's controller does with rollpackd besides
producing and fetching: list and inspect pools, annotate samples, create
steps (with an advantage estimator), read their plans and what their
micro-batches say about each sequence, release them, and find steps again
after a crash (docs/operations.md, "Controller"; docs/trainer.md,
"Per-sequence metadata").

    with rollpack.Controller("127.0.0.1:50051", token=ADMIN) as c:
        step = c.create_step("step-7", "grpo", num_groups=64,
                             topology={"dp": 8, "cp": 2, "max_tokens_per_rank": 16384})
        plan = c.plan("step-7")
        ...
        c.release("step-7")
        for s in c.steps():          # after a controller crash: what is still live
            print(s.step_id, s.created_unix_nanos, s.streams_open)

Every method raises the server's error as a rollpack.errors exception
(NotFound, FailedPrecondition, InvalidArgument, ...). Messages are the
protobuf messages of rollpack.v1 (StepInfo, Plan, PoolInfo).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, List, Mapping, Optional, Union

import grpc

from rollpack import connect_failure, errors
from rollpack._proto import (cluster_admin_pb2, cluster_admin_pb2_grpc, rollouts_pb2,
                             rollouts_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, trainer_pb2,
                             trainer_pb2_grpc)
from rollpack.annotations import AnnotationsLike, advantage_estimator, annotate_request
from rollpack.producer import PemSource, _read
from rollpack.step_sequences import SequenceInfo, collect, streams_to_read

#: The topology's sizes: an unset one is 1, one given must be >= 1.
_SIZES = ("dp", "cp", "tp", "pp")

#: A Topology message, or a dict of its fields.
TopologyLike = Union[scheduler_pb2.Topology, Mapping[str, Any]]

_SELECTIONS = {"oldest": scheduler_pb2.OLDEST, "newest_version": scheduler_pb2.NEWEST_VERSION}
_REPLAY_SOURCES = {"rollout": scheduler_pb2.REPLAY_SOURCE_ROLLOUT,
                   "recompute": scheduler_pb2.REPLAY_SOURCE_RECOMPUTE}


def topology_message(topology: Optional[TopologyLike] = None,
                     **fields: Any) -> scheduler_pb2.Topology:
    """A Topology message from a Topology, a dict of its fields, or keyword
    fields (``dp``, ``cp``, ``tp``, ``pp``, ``max_tokens_per_rank``, ...).
    A size (``dp``, ``cp``, ``tp``, ``pp``) given as 0 or less raises
    PayloadError naming it; one left out is 1."""
    if isinstance(topology, scheduler_pb2.Topology):
        if fields:
            raise TypeError("pass a Topology or its fields, not both")
        return topology
    merged = dict(topology or {})
    merged.update(fields)
    # An unset size reads as 1 on the wire (old clients rely on it); a size
    # given as 0 is a mistake (dp=0 is no data-parallel rank), not a 1.
    for name in _SIZES:
        value = merged.get(name)
        if value is not None and not isinstance(value, bool) and isinstance(value, int) \
                and value < 1:
            raise errors.PayloadError("topology: %s is %d, must be >= 1 (leave it out for 1)"
                                      % (name, value))
    try:
        return scheduler_pb2.Topology(**merged)
    except ValueError as e:
        raise errors.PayloadError("topology: %s" % e) from None


class Controller:
    """A training loop controller's client: pools, steps, plans, releases.
    A context manager (closes the channel).

    ``Controller(address, *, token=None, tls=False, root_certificates=None,
    client_certificate=None, client_key=None, server_name=None, timeout=30.0)``.
    """

    def __init__(self, address: str, *, token: Optional[str] = None, tls: bool = False,
                 root_certificates: Optional[PemSource] = None,
                 client_certificate: Optional[PemSource] = None,
                 client_key: Optional[PemSource] = None, server_name: Optional[str] = None,
                 timeout: float = 30.0) -> None:
        """Opens a channel to rollpackd at ``address`` ("host:port").

        - ``token``: a bearer token of a role allowed to call the methods used
          (trainer: create, plan, list; admin: release too).
        - ``tls``, ``root_certificates``, ``client_certificate`` +
          ``client_key``, ``server_name``: TLS as for :class:`rollpack.Producer`.
        - ``timeout``: seconds, the deadline of each call.
        """
        if address.startswith(("http://", "https://")):
            raise ValueError("address is host:port, got %r" % address)
        self.address = address
        self.timeout = float(timeout)
        self._metadata = (("authorization", "Bearer " + token),) if token else None
        options = [("grpc.max_receive_message_length", -1)]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        self._tls = bool(tls or root_certificates or client_certificate)
        if self._tls:
            if bool(client_certificate) != bool(client_key):
                raise ValueError("client_certificate and client_key go together (mutual TLS)")
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(root_certificates), private_key=_read(client_key),
                certificate_chain=_read(client_certificate))
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._rollouts = rollouts_pb2_grpc.RolloutsStub(self._channel)
        self._scheduler = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._trainer = trainer_pb2_grpc.TrainerStub(self._channel)
        self._cluster_admin = cluster_admin_pb2_grpc.ClusterAdminStub(self._channel)

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, what: str, method: Callable[..., Any], request: Any) -> Any:
        # Not retried: a controller's caller (a training loop, the CLI)
        # decides; errors retrying cannot fix say why (connect_failure).
        try:
            return method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            explained = None
            if connect_failure.classify(err) != connect_failure.RETRYABLE:
                speaks_tls = (not self._tls and connect_failure.closed_before_http2(err)
                              and connect_failure.server_speaks_tls(self.address))
                explained = connect_failure.explain(err, self.address, self._tls,
                                                    speaks_tls=speaks_tls)
            raise errors.from_rpc_error(err, what, explained=explained) from None

    # -- pools ---------------------------------------------------------------
    def pools(self) -> List[rollouts_pb2.PoolInfo]:
        """Every pool with a registered model (cluster-wide in a cluster), by
        name: a list of PoolInfo."""
        return list(self._call("ListPools", self._rollouts.ListPools,
                               rollouts_pb2.ListPoolsRequest()).pools)

    def pool(self, pool: str) -> rollouts_pb2.PoolInfo:
        """The pool's PoolInfo (samples, groups, versions, options)."""
        return self._call("GetPool %r" % pool, self._rollouts.GetPool,
                          rollouts_pb2.GetPoolRequest(pool=pool))

    def annotate(self, pool: str, annotations: AnnotationsLike) -> int:
        """Adds scalars (a reward, ...) to stored samples of ``pool`` in no
        live step (lifecycle.md section 6): ``{sample_id: {name: value}}``
        or a list of entries (rollpack.annotations). All or nothing, durable;
        returns the number of entries accepted (the same values again are
        no-ops). NotFound, InvalidArgument, FailedPrecondition name the
        pool, sample or scalar."""
        return self._call("AnnotateSamples of pool %r" % pool, self._rollouts.AnnotateSamples,
                          annotate_request(pool, annotations)).annotated

    def delete_pool(self, pool: str, *, force: bool = False,
                    dry_run: bool = False) -> rollouts_pb2.DeletePoolResponse:
        """Deletes ``pool`` with its samples (and, in a cluster, on every
        member and in etcd), durably: its name may then be registered with
        another model (docs/operations.md, "Deleting a pool"). With live
        steps: FailedPrecondition naming them, unless ``force`` (which
        releases them first). ``dry_run``: what would be deleted, nothing
        changed. NotFound for an unknown pool. An admin token."""
        return self._call("DeletePool %r" % pool, self._rollouts.DeletePool,
                          rollouts_pb2.DeletePoolRequest(pool=pool, force=force, dry_run=dry_run))

    def samples(self, pool: str, *, state: str = "", group_id: str = "",
                page_size: int = 0) -> Iterator[rollouts_pb2.SampleInfo]:
        """The pool's samples' metadata (SampleInfo: id, tokens, group,
        version, state, step, scalars, owner member), in sample id order, a
        page (``page_size``, 0 = 100) per call. ``state``: "" (all), "free",
        "held", "stale" or "open"; ``group_id``: "" (all) or one group."""
        states = {"": rollouts_pb2.SAMPLE_STATE_UNSPECIFIED, "free": rollouts_pb2.SAMPLE_STATE_FREE,
                  "held": rollouts_pb2.SAMPLE_STATE_HELD, "stale": rollouts_pb2.SAMPLE_STATE_STALE,
                  "open": rollouts_pb2.SAMPLE_STATE_OPEN}
        if state not in states:
            raise ValueError("state must be one of %s, got %r" % (sorted(states), state))
        request = rollouts_pb2.ListSamplesRequest(pool=pool, page_size=page_size,
                                                  state=states[state], group_id=group_id)
        while True:
            page = self._call("ListSamples of pool %r" % pool, self._rollouts.ListSamples, request)
            yield from page.samples
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    # -- steps ---------------------------------------------------------------
    def create_step(self, step_id: str, pool: str, *, topology: Optional[TopologyLike] = None,
                    sample_ids: Optional[Iterable[str]] = None, num_samples: int = 0,
                    num_groups: int = 0, num_tokens: int = 0, whole_groups: bool = False,
                    policy_version: int = 0, max_staleness: Optional[int] = None,
                    selection: str = "oldest", reuse_samples: bool = False,
                    replay_source: str = "rollout", advantage: Union[str, int, None] = None,
                    advantage_scalar: str = "", advantage_eps: float = 0.0,
                    **topology_fields: int) -> scheduler_pb2.StepInfo:
        """Creates step ``step_id`` from pool ``pool``: exactly one of
        ``sample_ids``, ``num_samples``, ``num_groups``, ``num_tokens``
        (docs/lifecycle.md). ``topology``: a Topology, a dict, or its fields as
        keywords (``dp=8, cp=2, max_tokens_per_rank=16384``). ``selection``:
        "oldest" or "newest_version". ``replay_source``: "rollout" (the
        engine's routing, R3) or "recompute" (the routing committed with
        :meth:`commit_routing`, R2; docs/layout.md section 11).
        ``advantage``: None or "none", "grpo" ((r - mean) / (std + eps) per
        group, population std), "grpo_mean" (r - mean) or "rloo" (r - mean
        of the group's others), computed over each group's samples in the
        step from scalar ``advantage_scalar`` ("" = "reward") and sent as
        every micro-batch's ``advantages``; ``advantage_eps``: GRPO's eps
        (0 = 1e-6) (lifecycle.md section 6). Returns the StepInfo."""
        if selection not in _SELECTIONS:
            raise ValueError("selection must be one of %s, got %r" % (sorted(_SELECTIONS), selection))
        if replay_source not in _REPLAY_SOURCES:
            raise ValueError("replay_source must be one of %s, got %r"
                             % (sorted(_REPLAY_SOURCES), replay_source))
        request = scheduler_pb2.CreateStepRequest(
            step_id=step_id, pool=pool, topology=topology_message(topology, **topology_fields),
            sample_ids=list(sample_ids or ()), num_samples=num_samples, num_groups=num_groups,
            num_tokens=num_tokens, whole_groups=whole_groups, policy_version=policy_version,
            selection=_SELECTIONS[selection], reuse_samples=reuse_samples,
            replay_source=_REPLAY_SOURCES[replay_source],
            advantage=advantage_estimator(advantage), advantage_scalar=advantage_scalar,
            advantage_eps=float(advantage_eps))
        if max_staleness is not None:
            request.max_staleness = max_staleness
        return self._call("CreateStep %r" % step_id, self._scheduler.CreateStep, request)

    def step(self, step_id: str) -> scheduler_pb2.StepInfo:
        """The live step's StepInfo with its created time and trainer streams
        (NotFound when it is not live)."""
        if not step_id:
            raise ValueError("step_id must be a non-empty string")
        return self._call("ListSteps %r" % step_id, self._scheduler.ListSteps,
                          scheduler_pb2.ListStepsRequest(step_id=step_id)).steps[0]

    def steps(self, pool: str = "") -> List[scheduler_pb2.StepInfo]:
        """The live steps (of ``pool``; "" = every pool), by id: StepInfo with
        created time and trainer streams (what a restarted controller finds)."""
        return list(self._call("ListSteps", self._scheduler.ListSteps,
                               scheduler_pb2.ListStepsRequest(pool=pool)).steps)

    def plan(self, step_id: str) -> scheduler_pb2.Plan:
        """The step's Plan (micro-batches, CP groups, sample ids)."""
        return self._call("GetPlan %r" % step_id, self._scheduler.GetPlan,
                          scheduler_pb2.GetPlanRequest(step_id=step_id))

    def sequences(self, step_id: str) -> List[SequenceInfo]:
        """Every sequence of the step, in plan order, as its micro-batches
        say (lifecycle.md section 6): SequenceInfo(sample_id, group_id,
        policy_version, scalars, advantage, microbatch). Reads the streams of
        one rank per CP group's first rank (rollpack.step_sequences: a
        rank's bytes each, with a trainer token), not GetPlan, which does
        not carry them."""
        plan = self.plan(step_id)
        info = self.step(step_id)

        def stream(rank):
            dp, cp, tp, pp = rank
            req = trainer_pb2.FetchRequest(step_id=step_id, rank=trainer_pb2.RankCoords(
                dp=dp, cp=cp, tp=tp, pp=pp))
            try:
                yield from self._trainer.FetchMicrobatches(req, timeout=self.timeout,
                                                           metadata=self._metadata)
            except grpc.RpcError as err:
                raise errors.from_rpc_error(
                    err, "FetchMicrobatches %r rank (dp=%d, cp=%d, tp=%d, pp=%d)"
                    % (step_id, dp, cp, tp, pp)) from None

        return collect(plan, (stream(r) for r in streams_to_read(plan, info)))

    def release(self, step_id: str) -> scheduler_pb2.ReleaseStepResponse:
        """Releases the step (its samples are deleted, or returned to the free
        set for a reuse step): the ReleaseStepResponse."""
        return self._call("ReleaseStep %r" % step_id, self._scheduler.ReleaseStep,
                          scheduler_pb2.ReleaseStepRequest(step_id=step_id))

    def commit_routing(self, step_id: str) -> trainer_pb2.CommitRoutingResponse:
        """R2: makes the routing every rank of ``step_id`` uploaded
        (:class:`rollpack.recompute.RoutingUploader`) its samples' recompute
        routing, durably. FailedPrecondition naming the first sample, token
        and layer not uploaded yet (nothing changes; the missing uploads may
        still come). Returns the CommitRoutingResponse."""
        return self._call("CommitRouting %r" % step_id, self._trainer.CommitRouting,
                          trainer_pb2.CommitRoutingRequest(step_id=step_id))

    def set_policy_version(self, pool: str, policy_version: int) -> rollouts_pb2.PoolInfo:
        """Records the trainer's policy version (docs/lifecycle.md): PoolInfo."""
        return self._call("SetPolicyVersion %r" % pool, self._scheduler.SetPolicyVersion,
                          scheduler_pb2.SetPolicyVersionRequest(pool=pool,
                                                                policy_version=policy_version))

    # -- the cluster (docs/cluster.md, "Maintenance: draining a member") ------
    def cluster_status(self) -> cluster_admin_pb2.ClusterStatus:
        """The ClusterStatus: etcd, and every live or drained member with its
        pools' samples, free samples, bytes and live steps (a member that
        does not answer has its ``error``). A single server lists itself.
        Admin token."""
        return self._call("GetClusterStatus", self._cluster_admin.GetClusterStatus,
                          cluster_admin_pb2.GetClusterStatusRequest())

    def drain(self, member: str) -> cluster_admin_pb2.DrainMemberResponse:
        """Drains ``member`` (its host:port) for maintenance: it refuses new
        samples and steps take its free samples first, until :meth:`undrain`
        (kept in etcd: it survives the member's restarts). NotFound for a
        member that is not live; FailedPrecondition on a single server."""
        return self._call("DrainMember %r" % member, self._cluster_admin.DrainMember,
                          cluster_admin_pb2.DrainMemberRequest(member=member))

    def undrain(self, member: str) -> cluster_admin_pb2.DrainMemberResponse:
        """Ends ``member``'s drain: it accepts new samples again."""
        return self._call("UndrainMember %r" % member, self._cluster_admin.UndrainMember,
                          cluster_admin_pb2.DrainMemberRequest(member=member))
