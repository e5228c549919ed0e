//! `kumo rate`, `kumo points` and `kumo statement`.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::Context;
use chrono::{DateTime, NaiveDate, Utc};
use clap::Subcommand;
use kumo_api_types::{ClassPrice, GrantCreate, RateCardInfo, RateCardPut, UsageGroup};

use crate::args::TenantArg;
use crate::client::Client;
use crate::output::{print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum RateCmd {
    /// Every rate card, and the one in force.
    List,
    /// Add a rate card (platform admins): `--price CLASS=GUARANTEED/SPOT`
    /// per hour, e.g. `--price gpu:H100-SXM5-80GB=400/120 --price vcpu=2/0.6`.
    Set {
        /// When it takes effect (RFC 3339 or YYYY-MM-DD, UTC) [default: now].
        #[arg(long)]
        from: Option<String>,
        /// A price per hour, CLASS=GUARANTEED/SPOT (e.g. vcpu=2/0.6); repeat
        /// for each class.
        #[arg(long = "price", value_parser = parse_price, required = true)]
        prices: Vec<(String, ClassPrice)>,
    },
}

#[derive(Subcommand, Debug)]
pub enum PointsCmd {
    /// Balance, grants and the latest charges.
    Show {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Grant points (platform admins).
    Grant {
        #[command(flatten)]
        tenant: TenantArg,
        /// How many points, e.g. 500 or 12.5.
        #[arg(long)]
        amount: String,
        /// RFC 3339 or YYYY-MM-DD (UTC midnight).
        #[arg(long)]
        expires: String,
        /// A note kept with the grant.
        #[arg(long)]
        note: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum UsageCmd {
    /// Charges summed by VM, resource or day over a period.
    Show {
        #[command(flatten)]
        tenant: TenantArg,
        /// RFC 3339 or YYYY-MM-DD [default: the first of this month].
        #[arg(long)]
        from: Option<String>,
        /// Exclusive [default: now].
        #[arg(long)]
        to: Option<String>,
        /// Sum by vm, resource or day.
        #[arg(long, value_enum, default_value = "vm")]
        by: GroupArg,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum GroupArg {
    Vm,
    Resource,
    Day,
}

#[derive(Subcommand, Debug)]
pub enum StatementCmd {
    /// A month's statement: `kumo statement get 2026-11 --tenant lab [--csv]`.
    Get {
        /// The month, YYYY-MM.
        month: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// The server's CSV instead of a table.
        #[arg(long)]
        csv: bool,
    },
}

fn parse_price(s: &str) -> Result<(String, ClassPrice), String> {
    let bad = || format!("{s:?}: expected CLASS=GUARANTEED/SPOT, e.g. vcpu=2/0.6");
    let (class, prices) = s.split_once('=').ok_or_else(bad)?;
    let (g, sp) = prices.split_once('/').ok_or_else(bad)?;
    Ok((
        class.to_owned(),
        ClassPrice {
            guaranteed: g.to_owned(),
            spot: sp.to_owned(),
        },
    ))
}

/// RFC 3339, a date (UTC midnight), or `+DURATION` from now (`+7d`).
pub(crate) fn parse_time(s: &str) -> anyhow::Result<DateTime<Utc>> {
    if let Some(ahead) = s.strip_prefix('+') {
        let secs = crate::args::parse_duration(ahead).map_err(anyhow::Error::msg)?;
        return i64::try_from(secs)
            .ok()
            .and_then(chrono::Duration::try_seconds)
            .and_then(|d| Utc::now().checked_add_signed(d))
            .with_context(|| format!("{s:?} is too far ahead"));
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let d = NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .with_context(|| format!("{s:?}: expected RFC 3339, YYYY-MM-DD or +DURATION (+7d)"))?;
    d.and_hms_opt(0, 0, 0)
        .map(|t| t.and_utc())
        .context("not a time")
}

fn cards_table(cards: &[RateCardInfo], current: Option<&RateCardInfo>) -> String {
    let mut t = Table::new(&["from", "class", "guaranteed/h", "spot/h", ""]);
    for c in cards {
        for (class, p) in &c.prices {
            t.row(vec![
                c.effective_from.format("%Y-%m-%d %H:%M:%S").to_string(),
                class.clone(),
                p.guaranteed.clone(),
                p.spot.clone(),
                if Some(c) == current {
                    "in force".into()
                } else {
                    String::new()
                },
            ]);
        }
    }
    t.render()
}

pub async fn rate(
    cmd: &RateCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let rates = match cmd {
        RateCmd::List => c.rates().await?,
        RateCmd::Set { from, prices } => {
            let effective_from = from.as_deref().map(parse_time).transpose()?;
            c.set_rates(&RateCardPut {
                effective_from,
                prices: prices.iter().cloned().collect::<BTreeMap<_, _>>(),
            })
            .await?
        }
    };
    print_one(out, fmt, &rates, || {
        format!(
            "Prices per hour, in {}:\n{}",
            rates.currency,
            cards_table(&rates.cards, rates.current.as_ref())
        )
    })
}

pub async fn points(
    cmd: &PointsCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match cmd {
        PointsCmd::Show { tenant } => {
            let p = c.points(&tenant.tenant).await?;
            print_one(out, fmt, &p, || {
                let mut g = Table::new(&["granted", "amount", "left", "expires", "note"]);
                for x in &p.grants {
                    g.row(vec![
                        x.granted_at.format("%Y-%m-%d").to_string(),
                        x.amount.clone(),
                        if x.expired {
                            "expired".into()
                        } else {
                            x.remaining.clone()
                        },
                        x.expires_at.format("%Y-%m-%d %H:%M").to_string(),
                        x.note.clone().unwrap_or_default(),
                    ]);
                }
                let mut l = Table::new(&["from", "vm", "resource", "level", "seconds", "amount"]);
                for x in p.ledger.iter().take(20) {
                    l.row(vec![
                        x.from.format("%Y-%m-%d %H:%M:%S").to_string(),
                        x.vm.clone(),
                        x.resource.clone(),
                        format!("{:?}", x.service_level).to_lowercase(),
                        x.seconds.to_string(),
                        x.amount.clone(),
                    ]);
                }
                format!(
                    "Balance: {} {} (owed {}, charged in all {})\n\nGrants:\n{}\nLatest charges:\n{}",
                    p.balance,
                    p.currency,
                    p.owed,
                    p.charged,
                    g.render(),
                    l.render()
                )
            })
        }
        PointsCmd::Grant {
            tenant,
            amount,
            expires,
            note,
        } => {
            let g = c
                .grant_points(
                    &tenant.tenant,
                    &GrantCreate {
                        amount: amount.clone(),
                        expires_at: parse_time(expires)?,
                        note: note.clone(),
                    },
                )
                .await?;
            print_one(out, fmt, &g, || {
                format!(
                    "Granted {} points to {}, until {}\n",
                    g.amount,
                    tenant.tenant,
                    g.expires_at.format("%Y-%m-%d %H:%M")
                )
            })
        }
    }
}

pub async fn usage(
    cmd: &UsageCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let UsageCmd::Show {
        tenant,
        from,
        to,
        by,
    } = cmd;
    let group = match by {
        GroupArg::Vm => UsageGroup::Vm,
        GroupArg::Resource => UsageGroup::Resource,
        GroupArg::Day => UsageGroup::Day,
    };
    let u = c
        .usage(
            &tenant.tenant,
            from.as_deref().map(parse_time).transpose()?,
            to.as_deref().map(parse_time).transpose()?,
            group,
        )
        .await?;
    print_one(out, fmt, &u, || {
        let mut t = Table::new(&["key", "seconds", "amount"]);
        for r in &u.rows {
            t.row(vec![r.key.clone(), r.seconds.to_string(), r.amount.clone()]);
        }
        format!(
            "Usage of {} from {} to {}\n{}Total: {}\n",
            u.tenant,
            u.from.format("%Y-%m-%d %H:%M"),
            u.to.format("%Y-%m-%d %H:%M"),
            t.render(),
            u.total
        )
    })
}

pub async fn statement(
    cmd: &StatementCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let StatementCmd::Get { month, tenant, csv } = cmd;
    if *csv {
        write!(out, "{}", c.statement_csv(&tenant.tenant, month).await?)?;
        return Ok(());
    }
    let s = c.statement(&tenant.tenant, month).await?;
    print_one(out, fmt, &s, || {
        let mut t = Table::new(&["vm", "resource", "level", "seconds", "rate/h", "amount"]);
        for l in &s.lines {
            t.row(vec![
                l.vm.clone(),
                l.resource.clone(),
                format!("{:?}", l.service_level).to_lowercase(),
                l.seconds.to_string(),
                l.rate_per_hour.clone(),
                l.amount.clone(),
            ]);
        }
        format!(
            "Statement {} for {}\n{}Total: {}\n",
            s.month,
            s.tenant,
            t.render(),
            s.total
        )
    })
}
