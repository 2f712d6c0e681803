#ifndef ROLLPACK_CLI_BENCH_MASK_COMMAND_H_
#define ROLLPACK_CLI_BENCH_MASK_COMMAND_H_

namespace rollpack {

// `rollpack bench mask`: what a sampling mask (a ragged token field,
// docs/layout.md section 13) costs. First its bytes per token on the wire and
// stored, as sent (CSR int32 or uint16 ids by vocabulary size) against a
// vocabulary bitset, over vocabulary sizes and kept-set sizes. Then the same
// rollouts ingested (validation and store, in this process, no gRPC) and
// fetched (every rank's micro-batches encoded as the server sends them), with
// and without the mask, in alternating rounds of one run. Prints a table and
// JSON; exit 0 when every sample was stored and every micro-batch encoded.
int RunBenchMaskCommand(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_MASK_COMMAND_H_
