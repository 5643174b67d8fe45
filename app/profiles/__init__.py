"""Tuning profiles: the model (:mod:`.model`), safe reading/atomic writing (:mod:`.io`),
the user + built-in library (:mod:`.library`) and ``vllm serve`` import/export
(:mod:`.interop`). The names below are the public API."""
from app.profiles.interop import (
    import_command_line,
    import_text,
    import_vllm_config_yaml,
    parse_command_line,
    to_command_line,
    to_vllm_config_yaml,
)
from app.profiles.io import MAX_PROFILE_BYTES, ProfileError, dump_profile, parse_profile, read_profile, write_profile
from app.profiles.library import ProfileEntry, ProfileLibrary, ProfileNotFound, ScanResult
from app.profiles.model import (
    SCHEMA_VERSION,
    HardwareFingerprint,
    LevelResult,
    Profile,
    ResultsSummary,
    SimRig,
    resolve_model_path,
    slugify,
)

__all__ = [
    "HardwareFingerprint", "LevelResult", "MAX_PROFILE_BYTES", "Profile", "ProfileEntry", "ProfileError",
    "ProfileLibrary", "ProfileNotFound", "ResultsSummary", "SCHEMA_VERSION", "ScanResult", "SimRig",
    "dump_profile", "import_command_line", "import_text", "import_vllm_config_yaml", "parse_command_line",
    "parse_profile", "read_profile", "resolve_model_path", "slugify", "to_command_line", "to_vllm_config_yaml",
    "write_profile",
]
