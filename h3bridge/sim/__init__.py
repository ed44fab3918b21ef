"""h3-sim: a simulator of antirez's `h3` command line (h3.c at 8974cc0) for tests and CI.

It produces synthetic test patterns, never model output.

Modules: `cli` (main.c), `getopt` (glibc getopt_long), `engine` (h3_load_dir / h3_generate /
cache API, time model, fault injection), `params` (h3_params, h3_valid_params, host maths),
`st_header` (h3_safetensors.c, h3_weights.c), `ffmpeg` (h3_ffmpeg.c process boundary),
`device` (simulated Metal device), `content` (the synthetic frames and audio),
`interactive` (h3_cli.c), `fixture` (model directories for tests), `double/` + `double_host`
(the libh3 double: h3.h's C ABI over this engine) and `library` (builds it: `h3-sim-lib`).
"""
