//! `weft`, the operator CLI: `weft demo`, `weft status`, `weft dataplane
//! [set MODE | reset]`, `weft leases [put KEY VALUE | rm KEY]`. The grammar,
//! exit codes and commands are in `weft_control::cli`.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(weft_control::cli::main())
}
