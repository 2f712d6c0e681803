#ifndef ROLLPACK_CLI_BENCH_PIECES_COMMAND_H_
#define ROLLPACK_CLI_BENCH_PIECES_COMMAND_H_

namespace rollpack {

// `rollpack bench pieces`: what extending a sample costs (docs/lifecycle.md,
// "Rollouts in pieces"). Rollouts of P pieces of T tokens each are written
// piece by piece (validation, store and durable log, in this process, no
// gRPC), side by side with the same rollouts sent whole and with one
// piece's worth sent as a whole sample. A piece must cost what it carries:
// the last pieces as much as the first, not P times more. Prints a table and
// JSON; exit 0 when every piece was stored and the sealed samples equal the
// whole ones.
int RunBenchPiecesCommand(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_PIECES_COMMAND_H_
