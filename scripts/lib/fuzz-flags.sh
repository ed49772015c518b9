# Sourced by scripts/test.sh (the fuzz smoke) and scripts/fuzz-count.sh, so that both run a
# fuzz target with the same libFuzzer flags.
#
# fuzz_target_flags CRATE_DIR TARGET sets the array fuzz_flags to the target's own flags, read
# from CRATE_DIR/fuzz_targets/TARGET.flags (none when there is no such file). Stateful targets
# list -len_control=0 there (whole sequences of steps from the first input, not a slow ramp from
# a few bytes), and media_model -detect_leaks=0 (LeakSanitizer reports the C library's
# per-thread destructor list of a SANITIZE worker thread still exiting). Flags given after
# these override them.
fuzz_target_flags() {
  fuzz_flags=()
  if [ -f "$1/fuzz_targets/$2.flags" ]; then
    read -r -a fuzz_flags < "$1/fuzz_targets/$2.flags"
  fi
}
