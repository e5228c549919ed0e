//! `kumo-server`: the control plane's binary.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kumo_server::config::{Config, LogFormat, ServeArgs};
use kumo_server::RunningServer;

/// glibc's allocator took a third of the server's CPU under 10,000
/// simulated hosts (`_int_malloc`, `malloc_consolidate`: many threads
/// freeing what others allocated); mimalloc's per-thread heaps do not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "kumo-server", version, about = "Kumo control plane")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API (migrates the database and bootstraps the admin on first start).
    Serve(ServeArgs),
    /// The whole system for trying it out: the server on SQLite, a fleet
    /// of simulated GPU hosts (agents on fixture machines and libvirt's test
    /// driver), a demo tenant and a template.
    Dev {
        #[command(flatten)]
        serve: ServeArgs,
        /// Simulated hosts (H100, A100, 2-NIC H100, L40S, CPU-only, repeating).
        #[arg(long, default_value_t = 4)]
        hosts: usize,
        /// Also one real host, `qemu-001` (run as root, libvirtd on
        /// qemu:///system): a CPU-only machine whose VMs boot this guest
        /// (a directory with `vmlinuz` and `initrd.img`, made by
        /// scripts/build-test-guest.sh) from the template `tiny`, reached
        /// over SSH from this machine. `./x start --qemu` builds the guest
        /// and passes it.
        #[arg(long, value_name = "DIR")]
        qemu_guest: Option<std::path::PathBuf>,
        /// More log: -v every request (heartbeats and polls too) and the
        /// agents' own lines, -vv debug. Without it: warnings, errors and
        /// one line per user action.
        #[arg(short, long, action = clap::ArgAction::Count)]
        verbose: u8,
    },
    /// Print the OpenAPI document.
    Openapi,
    /// An online, consistent copy of the embedded (SQLite) database while
    /// the server serves; PostgreSQL: use pg_dump.
    Backup {
        #[command(flatten)]
        serve: ServeArgs,
        /// The new file.
        #[arg(long)]
        to: std::path::PathBuf,
    },
    /// A backup put in place of the database of a fresh data directory.
    Restore {
        #[command(flatten)]
        serve: ServeArgs,
        /// The backup file.
        #[arg(long)]
        from: std::path::PathBuf,
    },
    /// Operations on the database itself (local access only).
    #[command(subcommand)]
    Admin(Admin),
    /// Benchmarks, each printing one JSON object.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Subcommand)]
enum Admin {
    /// Break-glass: a new administrator token (valid 24 h) written to a
    /// 0600 file, never printed, audited; for when every admin token is
    /// revoked or lost. Re-enables the user if disabled; creates it if
    /// missing. Needs the server's configuration (database).
    Recover {
        #[command(flatten)]
        serve: ServeArgs,
        /// The administrator to recover.
        #[arg(long, default_value = "admin")]
        user: String,
        /// Where to write the token [default: <data-dir>/recovery-token].
        #[arg(long)]
        to: Option<std::path::PathBuf>,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Placement over a synthetic fleet of fixture machines, Kumo's best
    /// fit against a naive first fit.
    Placement {
        #[arg(long, default_value_t = 1000)]
        hosts: usize,
        /// Fraction of GPUs held by background VMs.
        #[arg(long, default_value_t = 0.6)]
        fill: f64,
        #[arg(long, default_value_t = 10_000)]
        requests: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// NVSwitch hosts in Fabric Manager's shared mode: multi-GPU VMs
        /// on their default partitions only.
        #[arg(long)]
        partitions: bool,
    },
    /// A month of GPU requests from projects with guaranteed shares,
    /// replayed under refuse-and-retry and under the fair queue.
    Scheduling {
        #[arg(long, default_value_t = 256)]
        hosts: usize,
        #[arg(long, default_value_t = 16)]
        tenants: usize,
        #[arg(long, default_value_t = 30)]
        days: u32,
        /// GPU-hours asked for, as a fraction of the fleet's.
        #[arg(long, default_value_t = 1.0)]
        load: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Rating a month of synthetic lifecycle events and building every
    /// tenant's statement.
    Billing {
        #[arg(long, default_value_t = 1000)]
        tenants: usize,
        #[arg(long, default_value_t = 20)]
        vms_per_tenant: usize,
        #[arg(long, default_value_t = 31)]
        days: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Logs to stderr: JSON lines for machines (the default of `serve`), or
/// short human lines (the default of `dev`). `KUMO_LOG` (an `EnvFilter`)
/// overrides `default_filter`.
fn init_tracing(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KUMO_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init(),
        LogFormat::Text => builder
            .compact()
            .with_target(false)
            .with_timer(ClockTime)
            .fmt_fields(tracing_subscriber::fmt::format::debug_fn(human_field))
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}

/// Local wall-clock time to the second: enough for a person watching.
struct ClockTime;

impl tracing_subscriber::fmt::time::FormatTime for ClockTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "{}", chrono::Local::now().format("%H:%M:%S"))
    }
}

/// A field in a human line: the message, and the fields a person needs
/// (an error's cause, a host, a VM). Who did what to what is in the
/// audit line's sentence already, and request ids are for machines.
fn human_field(
    w: &mut tracing_subscriber::fmt::format::Writer<'_>,
    field: &tracing::field::Field,
    value: &dyn std::fmt::Debug,
) -> std::fmt::Result {
    match field.name() {
        "message" => write!(
            w,
            "{}",
            kumo_server::dev::human_words(&format!("{value:?}"))
        ),
        "actor" | "action" | "target" | "tenant" | "request_id" | "client_request_id" => Ok(()),
        name => write!(w, " {name}={value:?}"),
    }
}

/// What `serve` logs unless told otherwise: every request.
const SERVE_LOG: &str = "info,sqlx=warn,sea_orm=warn";

async fn dev(
    mut args: ServeArgs,
    hosts: usize,
    qemu_guest: Option<std::path::PathBuf>,
    verbose: u8,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    // A person reads dev's terminal: text unless JSON is asked for.
    if args.log_format.is_none() && std::env::var_os("KUMO_LOG_FORMAT").is_none() {
        args.log_format = Some(LogFormat::Text);
    }
    let config = Config::load(&args)?;
    let level = kumo_server::dev::LogLevel::from_verbosity(verbose);
    init_tracing(config.log_format, level.server_filter());
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let data_dir = config.data_dir.clone();
    let (mut server, fleet) =
        kumo_server::dev::dev(config, hosts, level, qemu_guest.as_deref()).await?;
    let url = server.url();
    // Written whole and without panicking: a reader that went away (a
    // pipe closed early) must not take the fleet down.
    let banner = kumo_server::dev::banner(&kumo_server::dev::BannerFacts {
        url: &url,
        hosts,
        data_dir: &data_dir,
        network: &fleet.network,
        verbose: level != kumo_server::dev::LogLevel::Quiet,
    });
    let _ = std::io::Write::write_all(&mut std::io::stdout(), banner.as_bytes());
    let stop = server.shutdown_handle();
    tokio::select! {
        res = server.wait() => return res,
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    drop(fleet);
    if let Some(tx) = stop {
        let _ = tx.send(());
    }
    server.wait().await
}

async fn recover(
    args: ServeArgs,
    user: String,
    to: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let config = Config::load(&args)?;
    let db = kumo_server::db::open(&config.database_url).await?;
    let to = to.unwrap_or_else(|| {
        config
            .data_dir
            .join(kumo_server::app::bootstrap::RECOVERY_TOKEN_FILE)
    });
    let path = kumo_server::app::bootstrap::recover(&db, &user, &to, chrono::Utc::now()).await?;
    // The path, never the token.
    println!(
        "A token for administrator `{user}`, valid {} hours, is in {} (readable by its owner only). Sign in with it and mint a lasting one.",
        kumo_server::app::bootstrap::RECOVERY_TOKEN_HOURS,
        path.display()
    );
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let config = Config::load(&args)?;
    init_tracing(config.log_format, SERVE_LOG);
    // Install the handlers before announcing the address: a supervisor may
    // send SIGTERM the moment it sees us, and the default action would
    // kill the process without draining requests.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut server = RunningServer::start(config).await?;
    if let Some(path) = &server.admin_token_file {
        // The path, never the token: logs are read by more people than the data dir.
        println!(
            "Created the platform admin `admin`; its API token is in {}",
            path.display()
        );
    }
    println!(
        "Kumo API listening on {}  (docs: {}/api/docs)",
        server.url(),
        server.url()
    );
    tracing::info!(addr = %server.addr, "listening");
    let stop = server.shutdown_handle();
    tokio::select! {
        res = server.wait() => return res,
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down");
    if let Some(tx) = stop {
        let _ = tx.send(());
    }
    server.wait().await?;
    Ok(())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Openapi => {
            print!("{}", kumo_server::http::api::openapi_json());
            Ok(())
        }
        Command::Bench(Bench::Placement {
            hosts,
            fill,
            requests,
            seed,
            partitions,
        }) => kumo_scheduler::bench::run(&kumo_scheduler::bench::BenchConfig {
            hosts,
            fill,
            requests,
            seed,
            partitions,
        })
        .map_err(anyhow::Error::msg)
        .and_then(|r| {
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }),
        Command::Bench(Bench::Scheduling {
            hosts,
            tenants,
            days,
            load,
            seed,
        }) => kumo_server::bench::run(&kumo_server::bench::SchedulingConfig {
            hosts,
            tenants,
            days,
            load,
            seed,
        })
        .map_err(anyhow::Error::msg)
        .and_then(|r| {
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }),
        Command::Bench(Bench::Billing {
            tenants,
            vms_per_tenant,
            days,
            seed,
        }) => {
            let r = kumo_billing::bench::run(&kumo_billing::bench::BenchConfig {
                tenants,
                vms_per_tenant,
                days: days.clamp(1, 31),
                seed,
            });
            serde_json::to_string(&r)
                .map(|j| println!("{j}"))
                .map_err(anyhow::Error::from)
        }
        Command::Backup { serve, to } => runtime().and_then(|rt| {
            rt.block_on(async {
                let config = Config::load(&serve)?;
                let s = kumo_server::backup::backup(&config.database_url, &to).await?;
                println!("{}", serde_json::to_string(&s)?);
                Ok(())
            })
        }),
        Command::Restore { serve, from } => runtime().and_then(|rt| {
            rt.block_on(async {
                let config = Config::load(&serve)?;
                let s = kumo_server::backup::restore(&from, &config.database_url).await?;
                println!("{}", serde_json::to_string(&s)?);
                Ok(())
            })
        }),
        Command::Admin(Admin::Recover { serve, user, to }) => {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(recover(serve, user, to)))
        }
        Command::Serve(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(serve(args))),
        Command::Dev {
            serve,
            hosts,
            qemu_guest,
            verbose,
        } => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(dev(serve, hosts, qemu_guest, verbose))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kumo-server: {e:#}");
            ExitCode::FAILURE
        }
    }
}
