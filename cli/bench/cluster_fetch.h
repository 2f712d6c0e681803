#ifndef ROLLPACK_CLI_BENCH_CLUSTER_FETCH_H_
#define ROLLPACK_CLI_BENCH_CLUSTER_FETCH_H_

namespace rollpack {

// `rollpack bench cluster --mode fetch` (issue 19): for each M of --members,
// an etcd and M rollpackd members as child processes, each holding its own
// share of the samples (optionally each in a network namespace behind a
// rate-limited link, --link-gbps), one step over all of them, and every
// rank fetching at once, each through "its" member (rank % M): by direct
// pulls (pieces straight from every owner) and by proxy (the member pulls
// the others' samples and streams whole micro-batches), alternating which
// goes first each round. Prints aggregate GB/s, the bytes members pulled
// from each other and the members' CPU per GB served, as a table and JSON.
// Exit 1 when a rank's bytes differ between the two deliveries (or between
// member counts), or direct pulls moved bytes between members.
int RunBenchClusterFetchCommand(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_CLUSTER_FETCH_H_
