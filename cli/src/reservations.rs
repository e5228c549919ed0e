//! `kumo reservation`: GPUs of one model held for a project over a window.

use std::io::Write;

use clap::Subcommand;
use kumo_api_types::{EndPolicy, Reservation, ReservationCreate};

use crate::args::TenantArg;
use crate::billing::parse_time;
use crate::client::{segment, Client};
use crate::output::{print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum ReservationCmd {
    /// Reserve GPUs for the project from --from to --to (platform admins;
    /// owners within the project's guaranteed share). Its hosts are held
    /// shortly before the start (spot and borrowed VMs on them get notice);
    /// it is charged for the GPUs held from start to end.
    Create {
        /// The reservation's name (VMs and clusters name it with
        /// --reservation).
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// GPUs to hold.
        #[arg(long)]
        gpus: u32,
        /// Their model, e.g. H100-SXM5-80GB.
        #[arg(long)]
        gpu_model: String,
        /// Start: RFC 3339, YYYY-MM-DD (UTC midnight) or +DURATION from
        /// now (+7d).
        #[arg(long)]
        from: String,
        /// End: RFC 3339, YYYY-MM-DD or +DURATION from now.
        #[arg(long)]
        to: String,
        /// At the end its VMs go on as ordinary VMs (release) or stop.
        #[arg(long, value_parser = parse_policy, default_value = "release")]
        end_policy: EndPolicy,
    },
    /// The project's reservations.
    List {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// One reservation: its window, state and GPUs held and used.
    Show {
        /// The reservation's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Cancel a reservation (it ends now, per its end policy), or forget
    /// one that has ended.
    Delete {
        /// The reservation's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
}

fn parse_policy(s: &str) -> Result<EndPolicy, String> {
    match s {
        "release" => Ok(EndPolicy::Release),
        "stop" => Ok(EndPolicy::Stop),
        _ => Err(format!("{s:?}: release or stop")),
    }
}

fn table(rs: &[Reservation]) -> String {
    let mut t = Table::new(&[
        "name", "gpus", "from", "to", "state", "held", "used", "at end",
    ]);
    for r in rs {
        let mut state = r.state.as_str().to_owned();
        if let Some(s) = &r.short {
            state = format!("{state} ({s})");
        }
        t.row(vec![
            r.name.clone(),
            format!("{} × {}", r.gpus, r.gpu_model),
            r.starts_at.format("%Y-%m-%d %H:%M").to_string(),
            r.ends_at.format("%Y-%m-%d %H:%M").to_string(),
            state,
            r.held_gpus.to_string(),
            r.used_gpus.to_string(),
            r.end_policy.as_str().to_owned(),
        ]);
    }
    t.render()
}

pub async fn reservation(
    cmd: &ReservationCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let base = |t: &TenantArg| format!("/api/v1/tenants/{}/reservations", segment(&t.tenant));
    let one = |t: &TenantArg, name: &str| format!("{}/{}", base(t), segment(name));
    let r: Reservation = match cmd {
        ReservationCmd::Create {
            name,
            tenant,
            gpus,
            gpu_model,
            from,
            to,
            end_policy,
        } => {
            let body = ReservationCreate {
                name: name.clone(),
                gpus: *gpus,
                gpu_model: gpu_model.clone(),
                starts_at: parse_time(from)?,
                ends_at: parse_time(to)?,
                end_policy: *end_policy,
            };
            c.post(&base(tenant), &body).await?
        }
        ReservationCmd::List { tenant } => {
            let rs: Vec<Reservation> = c.list_all(&base(tenant)).await?;
            return print_one(out, fmt, &rs, || table(&rs));
        }
        ReservationCmd::Show { name, tenant } => c.get(&one(tenant, name)).await?,
        ReservationCmd::Delete { name, tenant } => {
            c.delete(&one(tenant, name)).await?;
            writeln!(
                out,
                "Reservation {name} cancelled (or forgotten, if it had ended)"
            )?;
            return Ok(());
        }
    };
    print_one(out, fmt, &r, || table(std::slice::from_ref(&r)))
}
