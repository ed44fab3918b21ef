"""The model directory: `safetensors` headers read safely, the `inventory` of what is there (and what
h3 would refuse), `verify` (headers and checksums), and the `memory` plan of a request on this Mac."""
