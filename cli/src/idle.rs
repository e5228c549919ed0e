//! `kumo idle`: a project's idle-GPU policy and webhook, its GPU VMs as
//! the policy sees them, and owners' exemptions.

use std::io::Write;

use chrono::{DateTime, Utc};
use clap::Subcommand;
use kumo_api_types::{
    IdleAction, IdleExemptionRequest, IdlePolicyUpdate, IdlePolicyView, IdleReport, IdleVm,
};

use crate::args::TenantArg;
use crate::client::{segment, Client};
use crate::output::{print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum IdleCmd {
    /// The project's running GPU VMs: idle since when, notices sent, when
    /// the action falls due, exemptions.
    List {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// The policy in force (the platform's, or the project's own) and the
    /// webhook.
    Policy {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Set the project's own policy, replacing it (owners may only make the
    /// platform's stricter). Left out: the platform's value.
    SetPolicy {
        #[command(flatten)]
        tenant: TenantArg,
        /// A GPU below this utilisation (percent) is idle.
        #[arg(long)]
        utilization_pct: Option<f64>,
        /// Hours all of a VM's GPUs may be idle before the action.
        #[arg(long)]
        hours: Option<u32>,
        /// What follows a whole idle window: `notice` or `shelve`.
        #[arg(long, value_parser = parse_action)]
        action: Option<IdleAction>,
        /// Where notices are also posted (https://, public).
        #[arg(long)]
        webhook_url: Option<String>,
    },
    /// Back to the platform's policy, without a webhook.
    ResetPolicy {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Exempt a VM from the idle policy (owners), with a reason, for some
    /// days or until a time.
    Exempt {
        /// The VM's name or id.
        vm: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
        /// For this many days from now.
        #[arg(long, conflicts_with = "until", required_unless_present = "until")]
        days: Option<u32>,
        /// Until this time (RFC 3339, e.g. 2026-12-01T00:00:00Z).
        #[arg(long)]
        until: Option<DateTime<Utc>>,
    },
    /// End a VM's exemption now; its idle count starts over.
    Unexempt {
        /// The VM's name or id.
        vm: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
}

fn parse_action(s: &str) -> Result<IdleAction, String> {
    match s {
        "notice" => Ok(IdleAction::Notice),
        "shelve" => Ok(IdleAction::Shelve),
        _ => Err("`notice` or `shelve`".into()),
    }
}

fn when(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(|| "-".into(), |t| t.format("%Y-%m-%d %H:%M").to_string())
}

fn vms_table(r: &IdleReport) -> String {
    let p = &r.policy;
    let mut t = Table::new(&[
        "vm",
        "gpus",
        "idle for",
        "notices",
        "action at",
        "exempt until",
    ]);
    for v in &r.vms {
        t.row(vec![
            v.name.clone(),
            v.gpus.to_string(),
            if v.idle_since.is_some() {
                format!("{}h{:02}m", v.idle_minutes / 60, v.idle_minutes % 60)
            } else {
                "-".into()
            },
            v.notices.to_string(),
            when(v.action_at),
            match (&v.exempt_until, &v.exempt_reason) {
                (Some(u), Some(r)) => format!("{} ({r})", when(Some(*u))),
                (u, _) => when(*u),
            },
        ]);
    }
    format!(
        "Policy: idle below {} % for {} h, then {}.\n{}",
        p.utilization_pct,
        p.hours,
        p.action.as_str(),
        t.render()
    )
}

fn policy_text(p: &IdlePolicyView) -> String {
    let e = &p.effective;
    let mut s = format!(
        "In force: idle below {} % for {} h, then {} ({}).\nPlatform: below {} % for {} h, then {}. Exemptions: at most {} days.\n",
        e.utilization_pct,
        e.hours,
        e.action.as_str(),
        if p.own.is_some() { "the project's own" } else { "the platform's" },
        p.platform.utilization_pct,
        p.platform.hours,
        p.platform.action.as_str(),
        p.max_exemption_days,
    );
    if let Some(w) = &p.webhook {
        s.push_str(&format!(
            "Webhook: {} (last: {} {})\n",
            w.target,
            when(w.last_delivery_at),
            w.last_result.as_deref().unwrap_or("none yet")
        ));
    }
    s
}

fn vm_line(v: &IdleVm) -> String {
    match (&v.exempt_until, &v.action_at) {
        (Some(u), _) => format!("{}: exempt until {}\n", v.name, when(Some(*u))),
        (None, Some(a)) => format!(
            "{}: not exempt; the action falls due at {}\n",
            v.name,
            when(Some(*a))
        ),
        (None, None) => format!("{}: not exempt\n", v.name),
    }
}

pub async fn idle(
    cmd: &IdleCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let tenant_path = |t: &TenantArg| format!("/api/v1/tenants/{}", segment(&t.tenant));
    let exemption =
        |t: &TenantArg, vm: &str| format!("{}/vms/{}/idle-exemption", tenant_path(t), segment(vm));
    match cmd {
        IdleCmd::List { tenant } => {
            let r: IdleReport = c.get(&format!("{}/idle-vms", tenant_path(tenant))).await?;
            print_one(out, fmt, &r, || vms_table(&r))
        }
        IdleCmd::Policy { tenant } => {
            let p: IdlePolicyView = c
                .get(&format!("{}/idle-policy", tenant_path(tenant)))
                .await?;
            print_one(out, fmt, &p, || policy_text(&p))
        }
        IdleCmd::SetPolicy {
            tenant,
            utilization_pct,
            hours,
            action,
            webhook_url,
        } => {
            let p: IdlePolicyView = c
                .put(
                    &format!("{}/idle-policy", tenant_path(tenant)),
                    &IdlePolicyUpdate {
                        utilization_pct: *utilization_pct,
                        hours: *hours,
                        action: *action,
                        webhook_url: webhook_url.clone(),
                    },
                )
                .await?;
            print_one(out, fmt, &p, || policy_text(&p))
        }
        IdleCmd::ResetPolicy { tenant } => {
            c.delete(&format!("{}/idle-policy", tenant_path(tenant)))
                .await?;
            writeln!(
                out,
                "The platform's idle policy applies to {}.",
                tenant.tenant
            )?;
            Ok(())
        }
        IdleCmd::Exempt {
            vm,
            tenant,
            reason,
            days,
            until,
        } => {
            let until = match (until, days) {
                (Some(u), _) => *u,
                (None, Some(d)) => Utc::now() + chrono::Duration::days(i64::from(*d)),
                (None, None) => anyhow::bail!("give --days or --until"),
            };
            let v: IdleVm = c
                .put(
                    &exemption(tenant, vm),
                    &IdleExemptionRequest {
                        reason: reason.clone(),
                        until,
                    },
                )
                .await?;
            print_one(out, fmt, &v, || vm_line(&v))
        }
        IdleCmd::Unexempt { vm, tenant } => {
            let v: IdleVm = c.delete_json(&exemption(tenant, vm)).await?;
            print_one(out, fmt, &v, || vm_line(&v))
        }
    }
}
