"""Resource patterns shared by the compiler, the meet and the guard: paths, hosts, argv."""

from policy_engine.patterns.argv import CompiledSlot, compile_slots, first_mismatch
from policy_engine.patterns.hosts import HostPattern, canonical_hostname, validate_host_pattern
from policy_engine.patterns.paths import PathGlob, expand_home, glob_regex, validate_glob

__all__ = [
    "CompiledSlot", "HostPattern", "PathGlob", "canonical_hostname", "compile_slots",
    "expand_home", "first_mismatch", "glob_regex", "validate_glob", "validate_host_pattern",
]
