#ifndef ROLLPACK_CLI_DEMO_COMMAND_H_
#define ROLLPACK_CLI_DEMO_COMMAND_H_

namespace rollpack {

// `rollpack demo`: the end-to-end job on the embedded default configuration.
// Exits 0 only if every rank's bytes match the independent reference.
int RunDemoCommand(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_DEMO_COMMAND_H_
