"""The engines and what they share.

- `protocol`: the `Engine` protocol every engine implements, and `EngineCapabilities`.
- `oneshot`: one `h3` process per clip. `session`: a warm interactive `h3` kept between clips.
- `library`: libh3 through ctypes in a warm worker (`library_worker`; their messages `library_wire`;
  the CLI's `--engine library` is cli/library.py; `library_build` the library part of `build-engine`).
- `job`: the one job skeleton every engine's `generate` runs (each engine supplies only its run).
- `child`: the one wait loop (cancellable, deadlines on a pause-aware clock), a job on an engine child
  (stall watchdog, SIGSTOP/SIGCONT for a PauseControl, the paused event), the child-died error.
- `warm`: the lifecycle every warm engine shares (the lock held while warm, stepping aside for a
  waiting job, the idle timeout).
- `process`: an engine child in its own process group, its stderr, stopping it.
- `lock`: the machine-wide engine lock and the record of the engine its holder runs.
- `locate`: where the engine, the model and FFmpeg are. `h3_command`: h3's argv, phases, messages.
- `output`: atomic publishing of the MP4 and the result. `disk`: free space and writable folders.
- `hints`: the fix for each kind of failure.
"""
