"""The open-files limit of this process (one descriptor per socket): raised to fit the connections a server
accepts or a load test opens, the hard limit too where the process may (root, CAP_SYS_RESOURCE)."""

from __future__ import annotations


def raise_open_files(want: int) -> tuple[int, int]:
    """Raise the soft limit of open files to at least ``want``: within the hard limit, or beyond it where the
    process is allowed to raise the hard limit too. Returns (soft, hard) afterwards; (want, want) where the
    platform has no such limit (Windows)."""
    try:
        import resource
    except ImportError:
        return want, want
    inf = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == inf or soft >= want:
        return soft, hard
    if hard != inf and hard < want:
        try:  # privileged: a server machine's default hard limit (often 1024-4096) is no ceiling
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return resource.getrlimit(resource.RLIMIT_NOFILE)
        except (ValueError, OSError):
            pass
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == inf else min(want, hard), hard))
    except (ValueError, OSError):
        pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)
