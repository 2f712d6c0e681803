#ifndef ROLLPACK_CLI_BENCH_CAPTURE_COMMAND_H_
#define ROLLPACK_CLI_BENCH_CAPTURE_COMMAND_H_

namespace rollpack {

// `rollpack bench capture`: what the HTTP capture port costs
// (shared/spec/capture.md section 8, issue 37). A stand-in vLLM in this
// process (cli/bench/capture_engine.h) answers /v1/chat/completions with
// bodies computed once, behind a rollpackd child with --capture-*. Side by
// side in one run:
//   - per request, one at a time, for choices of 1k / 8k / 32k tokens of a
//     48-layer top-8 model (uint8 ids, E = 128; and an int16 row, E = 384):
//     rollpackd's own time (its log's per-request overhead, and the
//     rollpack_capture_overhead_seconds histogram), and the latency end to
//     end through the capture port against the same request sent straight
//     to the engine, alternated; the bytes removed from the answers per
//     token; and the same work in this process, step by step (where the
//     time goes);
//   - 2,000 requests in flight at once on a fresh rollpackd child: its
//     threads, open files and RSS, and that every request was answered and
//     every sample stored (GetPool);
//   - server-sent events passed through: the latency of each event through
//     the port against straight from the engine, streams of both at once.
// Prints tables and JSON; exit 0 only when every request was answered and
// every captured sample stored (the targets are reported, not enforced).
int RunBenchCaptureCommand(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_CAPTURE_COMMAND_H_
