use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use kumo_cli::commands::{run, server_of, Cli};
use kumo_cli::hints;

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.format(&mut Cli::command()).exit(),
    };
    let ctx = hints::Context::of(&matches, server_of(&cli));
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kumo: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout().lock();
    match rt.block_on(run(cli, &mut stdout)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kumo: {e:#}");
            if let Some(hint) = hints::for_error(&e, &ctx) {
                eprintln!("hint: {hint}");
            }
            ExitCode::FAILURE
        }
    }
}
