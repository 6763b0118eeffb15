"""nn.Modules only: each model with its dims dataclass; no I/O, no device policy."""
