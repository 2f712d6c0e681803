#ifndef ROLLPACK_CLI_BENCH_CLUSTER_COMMAND_H_
#define ROLLPACK_CLI_BENCH_CLUSTER_COMMAND_H_

namespace rollpack {

// `rollpack bench cluster`: an etcd and M rollpackd members (plus one that
// holds no samples) against one single rollpackd holding the same samples,
// all on 127.0.0.1. Measures, side by side in one run, CreateStep over S
// samples spread on the members against the same plan on the single server,
// the bytes members exchanged to plan (metadata only), the etcd step record,
// and fetching every rank through the member that holds none of the
// samples. Prints a table and JSON. Exit 0 only when every rank's bytes
// through the cluster equal the single server's.
int RunBenchClusterCommand(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_CLUSTER_COMMAND_H_
