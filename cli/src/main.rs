use std::process::ExitCode;

use clap::Parser;
use kumo_cli::commands::{run, Cli};

fn main() -> ExitCode {
    let cli = Cli::parse();
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
            ExitCode::FAILURE
        }
    }
}
