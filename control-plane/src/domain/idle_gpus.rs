//! Idle GPUs: when a GPU VM counts as idle, which notice or action is due,
//! and what a project or an owner may set. Plain functions over plain
//! data; the pass that applies them is `app::idle_gpus`.
//!
//! A VM is idle while *every* one of its GPUs reads below the threshold
//! (minute means). A minute in which any GPU could not say how busy it
//! was breaks an idle spell, and so does a silence of more than
//! [`MAX_GAP_MINUTES`]: unknown is never idle.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use chrono::{DateTime, Duration, Utc};
use kumo_api_types::{IdleAction, IdlePolicy};

/// Missing minutes an idle spell survives (a missed reading, a server
/// restart); a longer silence ends it.
pub const MAX_GAP_MINUTES: i64 = 5;
/// The longest window a policy may have (30 days, the figures' retention).
pub const MAX_HOURS: u32 = 720;

/// The platform's policy unless the configuration says otherwise: below
/// 5 % for a day, then a notice.
pub const PLATFORM_DEFAULT: IdlePolicy = IdlePolicy {
    utilization_pct: 5.0,
    hours: 24,
    action: IdleAction::Notice,
};

/// One minute of a VM's GPUs: how many could say how busy they were and
/// the busiest one's mean.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinuteUse {
    pub at: DateTime<Utc>,
    pub read: u32,
    pub busiest: Option<f64>,
}

/// Since when a VM with `gpus` GPUs has been idle at `now`, from its
/// minutes in time order: the start of the unbroken run of idle minutes
/// that reaches the present. `None` when it is busy, cannot say, or has
/// been silent longer than [`MAX_GAP_MINUTES`].
pub fn idle_since(
    minutes: &[MinuteUse],
    gpus: u32,
    threshold_pct: f64,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let gap = Duration::minutes(MAX_GAP_MINUTES);
    let mut since = None;
    // The end of the minute after the one looked at: `now` at first.
    let mut later = now;
    for m in minutes.iter().rev() {
        let end = m.at + Duration::minutes(1);
        if later - end > gap || gpus == 0 || m.read < gpus {
            break;
        }
        match m.busiest {
            Some(u) if u < threshold_pct => {}
            _ => break,
        }
        since = Some(m.at);
        later = m.at;
    }
    since
}

/// What the idle pass does next for one VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Half the window is gone.
    Half,
    /// The window is nearly over.
    Final,
    /// The window is over and the final notice is old enough.
    Act,
}

impl Step {
    /// The number of notices sent once this step is taken.
    pub fn notices(self) -> u8 {
        match self {
            Step::Half => 1,
            Step::Final => 2,
            Step::Act => 3,
        }
    }
}

fn window(p: &IdlePolicy) -> Duration {
    Duration::hours(i64::from(p.hours))
}

/// How long before the end the final notice goes, and the least time
/// between it and the action: an hour, or a quarter of a shorter window.
pub fn lead(p: &IdlePolicy) -> Duration {
    (window(p) / 4).min(Duration::hours(1))
}

/// The step due for a VM idle for `idle_for` that has had `notices`, the
/// last at `noticed_at`. Steps go one at a time, so the project always
/// hears both notices, and the action waits [`lead`] after the final one
/// (a server that was down for the whole window warns before it acts).
pub fn due(
    p: &IdlePolicy,
    idle_for: Duration,
    notices: u8,
    noticed_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<Step> {
    let w = window(p);
    match notices {
        0 if idle_for >= w / 2 => Some(Step::Half),
        1 if idle_for >= w - lead(p) => Some(Step::Final),
        2 if idle_for >= w && noticed_at.is_none_or(|t| now - t >= lead(p)) => Some(Step::Act),
        _ => None,
    }
}

/// When the action falls due for a spell that counts from `start`, if
/// nothing changes.
pub fn action_at(
    p: &IdlePolicy,
    start: DateTime<Utc>,
    notices: u8,
    noticed_at: Option<DateTime<Utc>>,
) -> Option<DateTime<Utc>> {
    let end = start + window(p);
    match (notices, noticed_at) {
        (3.., _) => None,
        (2, Some(t)) => Some(end.max(t + lead(p))),
        _ => Some(end),
    }
}

/// What the spell counts from: its start, or the end of an exemption that
/// ended during it (the project then hears both notices again).
pub fn counted_from(since: DateTime<Utc>, exempt_until: Option<DateTime<Utc>>) -> DateTime<Utc> {
    exempt_until.map_or(since, |e| e.max(since))
}

/// A policy's values are in range; else the field at fault and why.
pub fn validate(p: &IdlePolicy) -> Result<(), (&'static str, String)> {
    if !(p.utilization_pct.is_finite() && p.utilization_pct > 0.0 && p.utilization_pct <= 100.0) {
        return Err(("utilization_pct", "above 0 and at most 100".into()));
    }
    if !(1..=MAX_HOURS).contains(&p.hours) {
        return Err(("hours", format!("1 to {MAX_HOURS}")));
    }
    Ok(())
}

/// A project's owner may only make the platform's policy stricter: a
/// threshold at least as high, a window at most as long, and no notice
/// where the platform shelves.
pub fn no_laxer(own: &IdlePolicy, platform: &IdlePolicy) -> Result<(), String> {
    if own.utilization_pct < platform.utilization_pct {
        return Err(format!(
            "the platform counts a GPU below {} % as idle; a project may raise that, not lower it",
            platform.utilization_pct
        ));
    }
    if own.hours > platform.hours {
        return Err(format!(
            "the platform's window is {} h; a project may shorten it, not lengthen it",
            platform.hours
        ));
    }
    if own.action < platform.action {
        return Err("the platform shelves idle VMs; a project cannot only be told".into());
    }
    Ok(())
}

/// An exemption's reason and end; else the field at fault and why. The
/// reason is shown to admins (audit log, terminals): no control
/// characters.
pub fn exemption(
    reason: &str,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
    max_days: Option<u32>,
) -> Result<(), (&'static str, String)> {
    let reason = reason.trim();
    if reason.is_empty() || reason.chars().count() > 500 {
        return Err(("reason", "1 to 500 characters".into()));
    }
    if reason.chars().any(char::is_control) {
        return Err(("reason", "no control characters".into()));
    }
    if until <= now {
        return Err(("until", "in the future".into()));
    }
    if let Some(d) = max_days {
        if until > now + Duration::days(i64::from(d)) {
            return Err((
                "until",
                format!("an exemption runs at most {d} days; ask an administrator for longer"),
            ));
        }
    }
    Ok(())
}

/// A duration as a person reads a span of days: `3 days 4 h`, `5 h`,
/// `20 min`.
fn days_text(d: Duration) -> String {
    let h = d.num_hours().max(0);
    match (h / 24, h % 24) {
        (0, 0) => format!("{} min", d.num_minutes().max(0)),
        (0, h) => format!("{h} h"),
        (1, 0) => "1 day".into(),
        (d, 0) => format!("{d} days"),
        (1, h) => format!("1 day {h} h"),
        (d, h) => format!("{d} days {h} h"),
    }
}

/// The exempt time a VM has had in all once its exemption is set to run
/// to `until` (`None`: it ends now), from `total`, what it had so far
/// counting an exemption in force to its end. A renewal or change
/// replaces the rest of the one in force, so only time actually exempt,
/// or still held, counts. Past `cap` (owners; `None` for administrators)
/// it is refused, saying how much is left.
pub fn exempt_total(
    total: Duration,
    in_force_until: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    cap: Option<Duration>,
) -> Result<Duration, String> {
    let unused = in_force_until.map_or(Duration::zero(), |u| (u - now).max(Duration::zero()));
    // At least zero: rows from before totals were kept hold none.
    let had = (total - unused).max(Duration::zero());
    let new = until.map_or(Duration::zero(), |u| (u - now).max(Duration::zero()));
    let sum = had.checked_add(&new).unwrap_or(Duration::MAX);
    if let Some(cap) = cap {
        if sum > cap {
            let left = (cap - had).max(Duration::zero());
            return Err(format!(
                "a VM may be exempt for at most {} in all, renewals included; this one has {} left",
                days_text(cap),
                days_text(left)
            ));
        }
    }
    Ok(sum)
}

/// Whether a webhook may be sent to this address: one on the public
/// internet (a project must not make the control plane reach into its own
/// network, a host's metadata service or another project's segment). An
/// IPv6 address that carries an IPv4 one (mapped, compatible, translated,
/// NAT64, 6to4, Teredo) is judged by the IPv4 it carries: a host or relay
/// that speaks both would deliver it there.
pub fn public_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => public_v6(v6),
    }
}

fn public_v4(v4: Ipv4Addr) -> bool {
    let [a, b, c, _] = v4.octets();
    !(v4.is_private()
        || v4.is_loopback()
        || v4.is_link_local()
        || v4.is_unspecified()
        || v4.is_broadcast()
        || v4.is_multicast()
        || v4.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast (deprecated)
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || a >= 240)
}

/// The 32 bits of `v6` from bit `at` on, as an IPv4 address.
fn v4_at(v6: Ipv6Addr, at: usize) -> Ipv4Addr {
    let o = v6.octets();
    Ipv4Addr::new(o[at / 8], o[at / 8 + 1], o[at / 8 + 2], o[at / 8 + 3])
}

fn public_v6(v6: Ipv6Addr) -> bool {
    let seg = v6.segments();
    // ::/96 (IPv4-compatible, `::` and `::1` among them), ::ffff:0:0/96
    // (IPv4-mapped) and ::ffff:0:0:0/96 (IPv4-translated): the last 32
    // bits. The rest of ::/8 is reserved.
    if seg[..4] == [0, 0, 0, 0] {
        return match (seg[4], seg[5]) {
            (0, 0) | (0, 0xffff) | (0xffff, 0) => public_v4(v4_at(v6, 96)),
            _ => false,
        };
    }
    // NAT64's well-known prefix 64:ff9b::/96: the IPv4 in its last 32
    // bits. The rest of 64:ff9b::/32 (local-use 64:ff9b:1::/48) is never.
    if seg[0] == 0x0064 && seg[1] == 0xff9b {
        return seg[2..6] == [0, 0, 0, 0] && public_v4(v4_at(v6, 96));
    }
    if seg[0] & 0xff00 == 0 {
        return false;
    }
    // 6to4 (2002::/16): the IPv4 in bits 16..48.
    if seg[0] == 0x2002 {
        return public_v4(v4_at(v6, 16));
    }
    // Teredo (2001:0::/32): the server in bits 32..64 and the client,
    // inverted, in the last 32; both must be public.
    if seg[0] == 0x2001 && seg[1] == 0 {
        let server = v4_at(v6, 32);
        let client = Ipv4Addr::from(!u32::from(v4_at(v6, 96)));
        return public_v4(server) && public_v4(client);
    }
    !(v6.is_multicast()
        || (seg[0] & 0xfe00) == 0xfc00 // unique local
        || (seg[0] & 0xffc0) == 0xfe80 // link local
        || (seg[0] & 0xffc0) == 0xfec0 // site local (deprecated, still routed inside sites)
        || seg[0] == 0x0100 && seg[1..4] == [0, 0, 0] // discard only (100::/64)
        || seg[0] == 0x2001 && seg[1] == 0x0db8 // documentation
        || seg[0] == 0x2001 && (0x0010..0x0020).contains(&seg[1]) // ORCHID
        || seg[0] == 0x2001 && seg[1] == 0x0002 && seg[2] == 0 // benchmarking
        || seg[0] == 0x3fff && seg[1] < 0x1000) // documentation (3fff::/20)
}

/// Whether a webhook may go to `ip`: a public address, or loopback where
/// the configuration allows it (development and tests).
pub fn acceptable(ip: IpAddr, allow_loopback: bool) -> bool {
    public_address(ip) || (allow_loopback && ip.is_loopback())
}

/// Of the addresses a webhook's name resolved to when it is posted (A and
/// AAAA answers alike), the first that is not acceptable: the post goes
/// nowhere if any is, since the name could be made to answer it next.
pub fn unacceptable_among(
    addrs: impl IntoIterator<Item = IpAddr>,
    allow_loopback: bool,
) -> Option<IpAddr> {
    addrs
        .into_iter()
        .find(|ip| !acceptable(*ip, allow_loopback))
}

/// A webhook address as given: `https://` to a public host, without user
/// information (or, where loopback is allowed, `http://` to loopback).
/// The names' addresses are checked again when it is sent.
pub fn webhook_url(raw: &str, allow_loopback: bool) -> Result<url::Url, String> {
    if raw.len() > 2000 {
        return Err("at most 2000 characters".into());
    }
    let url = url::Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("no user or password in the address".into());
    }
    let loopback = match url.host() {
        None => return Err("an address with a host".into()),
        Some(url::Host::Ipv4(a)) if !acceptable(IpAddr::V4(a), allow_loopback) => {
            return Err("a public address".into())
        }
        Some(url::Host::Ipv6(a)) if !acceptable(IpAddr::V6(a), allow_loopback) => {
            return Err("a public address".into())
        }
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            let local = d == "localhost" || d.ends_with(".localhost");
            if local && !allow_loopback {
                return Err("a public address".into());
            }
            local
        }
    };
    match url.scheme() {
        "https" => Ok(url),
        "http" if loopback => Ok(url),
        _ => Err("an https:// address".into()),
    }
}

/// What of a webhook's address is shown again: its scheme and host.
pub fn webhook_target(url: &url::Url) -> String {
    format!("{}://{}", url.scheme(), url.host_str().unwrap_or("?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(min: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_900_000_000 - 1_900_000_000 % 60, 0).unwrap()
            + Duration::minutes(min)
    }

    fn m(min: i64, read: u32, busiest: Option<f64>) -> MinuteUse {
        MinuteUse {
            at: t(min),
            read,
            busiest,
        }
    }

    #[test]
    fn idle_runs_back_from_now_and_unknown_or_silence_breaks_them() {
        let now = t(10) + Duration::seconds(30);
        let idle: Vec<_> = (0..=10).map(|i| m(i, 2, Some(1.0))).collect();
        assert_eq!(idle_since(&idle, 2, 5.0, now), Some(t(0)));
        // A busy minute: the spell starts after it.
        let mut busy = idle.clone();
        busy[4].busiest = Some(50.0);
        assert_eq!(idle_since(&busy, 2, 5.0, now), Some(t(5)));
        // A GPU that could not say is not idle.
        let mut unknown = idle.clone();
        unknown[7].read = 1;
        assert_eq!(idle_since(&unknown, 2, 5.0, now), Some(t(8)));
        unknown[10].busiest = None;
        assert_eq!(idle_since(&unknown, 2, 5.0, now), None);
        // Short gaps are survived, long ones are not.
        let gappy: Vec<_> = idle
            .iter()
            .copied()
            .filter(|x| !(3..=6).contains(&((x.at - t(0)).num_minutes())))
            .collect();
        assert_eq!(
            idle_since(&gappy, 2, 5.0, now),
            Some(t(0)),
            "4 missing minutes"
        );
        let long: Vec<_> = idle
            .iter()
            .copied()
            .filter(|x| !(2..=7).contains(&((x.at - t(0)).num_minutes())))
            .collect();
        assert_eq!(
            idle_since(&long, 2, 5.0, now),
            Some(t(8)),
            "6 missing minutes"
        );
        // Stale: the last reading is long gone.
        assert_eq!(idle_since(&idle, 2, 5.0, now + Duration::minutes(10)), None);
        assert_eq!(idle_since(&[], 2, 5.0, now), None);
        // Exactly the threshold is not idle.
        assert_eq!(idle_since(&[m(10, 1, Some(5.0))], 1, 5.0, now), None);
    }

    #[test]
    fn notices_come_one_at_a_time_and_the_action_waits_for_the_final_one() {
        let p = IdlePolicy {
            utilization_pct: 5.0,
            hours: 24,
            action: IdleAction::Shelve,
        };
        let h = Duration::hours;
        let now = t(0);
        assert_eq!(due(&p, h(11), 0, None, now), None);
        assert_eq!(due(&p, h(12), 0, None, now), Some(Step::Half));
        assert_eq!(due(&p, h(22), 1, None, now), None);
        assert_eq!(due(&p, h(23), 1, None, now), Some(Step::Final));
        assert_eq!(due(&p, h(24), 2, Some(now - h(1)), now), Some(Step::Act));
        assert_eq!(due(&p, h(24), 3, None, now), None, "acted once");
        // Idle past the whole window with nothing sent (the server was
        // down): the half notice first, and the action an hour after the
        // final one.
        assert_eq!(due(&p, h(30), 0, None, now), Some(Step::Half));
        assert_eq!(due(&p, h(30), 1, None, now), Some(Step::Final));
        let late = Some(now - Duration::minutes(59));
        assert_eq!(due(&p, h(30), 2, late, now), None);
        assert_eq!(
            action_at(&p, now - h(30), 2, late),
            Some(now + Duration::minutes(1))
        );
        assert_eq!(action_at(&p, now, 0, None), Some(now + h(24)));
        // A short window's lead is a quarter of it.
        let short = IdlePolicy { hours: 1, ..p };
        assert_eq!(lead(&short), Duration::minutes(15));
        assert_eq!(
            due(&short, Duration::minutes(45), 1, None, now),
            Some(Step::Final)
        );
        // An exemption that ended during the spell restarts the count.
        assert_eq!(counted_from(t(0), Some(t(30))), t(30));
        assert_eq!(counted_from(t(30), Some(t(0))), t(30));
    }

    #[test]
    fn owners_may_only_tighten_and_exemptions_are_bounded() {
        let platform = PLATFORM_DEFAULT;
        let tighter = IdlePolicy {
            utilization_pct: 10.0,
            hours: 4,
            action: IdleAction::Shelve,
        };
        assert!(no_laxer(&tighter, &platform).is_ok());
        assert!(no_laxer(
            &IdlePolicy {
                utilization_pct: 1.0,
                ..tighter
            },
            &platform
        )
        .is_err());
        assert!(no_laxer(
            &IdlePolicy {
                hours: 48,
                ..tighter
            },
            &platform
        )
        .is_err());
        assert!(
            no_laxer(&platform, &tighter).is_err(),
            "notice where the platform shelves"
        );
        assert!(validate(&IdlePolicy {
            utilization_pct: f64::NAN,
            ..tighter
        })
        .is_err());
        assert!(validate(&IdlePolicy {
            hours: 0,
            ..tighter
        })
        .is_err());
        assert!(validate(&IdlePolicy {
            hours: 721,
            ..tighter
        })
        .is_err());
        let now = t(0);
        assert!(exemption(
            "training resumes Monday",
            now + Duration::days(3),
            now,
            Some(14)
        )
        .is_ok());
        assert!(exemption(" ", now + Duration::days(3), now, Some(14)).is_err());
        assert_eq!(
            exemption("\u{1b}[2J", now + Duration::days(3), now, Some(14)).map_err(|e| e.0),
            Err("reason"),
            "terminal escapes never reach an admin's audit log"
        );
        assert_eq!(
            exemption("x", now, now, Some(14)).map_err(|e| e.0),
            Err("until")
        );
        assert!(exemption("x", now, now, Some(14)).is_err());
        assert!(exemption("x", now + Duration::days(15), now, Some(14)).is_err());
        assert!(exemption("x", now + Duration::days(15), now, None).is_ok());
    }

    #[test]
    fn exempt_time_adds_up_to_a_cap_renewals_included() {
        let now = t(0);
        let d = Duration::days;
        let cap = Some(d(30));
        // A first exemption of 14 days.
        assert_eq!(
            exempt_total(d(0), None, Some(now + d(14)), now, cap),
            Ok(d(14))
        );
        // Renewed with 4 of its days left: those 4 are replaced, not added.
        assert_eq!(
            exempt_total(d(14), Some(now + d(4)), Some(now + d(14)), now, cap),
            Ok(d(24))
        );
        // 20 used and 4 held: 14 more is past 30, and the refusal says
        // how much is left (10 days, counting the 4 held as given back).
        let e = exempt_total(d(24), Some(now + d(4)), Some(now + d(14)), now, cap).unwrap_err();
        assert!(
            e.contains("30 days in all") && e.contains("10 days left"),
            "{e}"
        );
        assert_eq!(
            exempt_total(d(24), Some(now + d(4)), Some(now + d(10)), now, cap),
            Ok(d(30)),
            "exactly the cap"
        );
        // Ended early: what it did not use is given back.
        assert_eq!(
            exempt_total(d(30), Some(now + d(8)), None, now, None),
            Ok(d(22))
        );
        // An exemption that already ran out is all used.
        assert_eq!(
            exempt_total(d(30), Some(now - d(1)), Some(now + d(1)), now, cap).unwrap_err(),
            "a VM may be exempt for at most 30 days in all, renewals included; this one has 0 min left"
        );
        // Administrators (no cap) go past it; the total still counts.
        assert_eq!(
            exempt_total(d(30), None, Some(now + d(20)), now, None),
            Ok(d(50))
        );
        // Rows from before totals were kept: never below zero.
        assert_eq!(
            exempt_total(d(0), Some(now + d(5)), Some(now + d(3)), now, cap),
            Ok(d(3))
        );
        // Hours and minutes where days are too coarse.
        let e =
            exempt_total(d(30) - Duration::hours(5), None, Some(now + d(1)), now, cap).unwrap_err();
        assert!(e.ends_with("has 5 h left"), "{e}");
        let e = exempt_total(
            d(30) - Duration::minutes(20),
            None,
            Some(now + d(1)),
            now,
            cap,
        )
        .unwrap_err();
        assert!(e.ends_with("has 20 min left"), "{e}");
    }

    #[test]
    fn webhooks_go_only_to_public_https_addresses() {
        for bad in [
            "http://hooks.example.org/x",
            "https://127.0.0.1/x",
            "https://10.1.2.3/x",
            "https://169.254.169.254/latest/meta-data",
            "https://[::1]/x",
            "https://[fd00::1]/x",
            "https://[::ffff:192.168.1.1]/x",
            "https://100.64.0.1/x",
            "https://localhost/x",
            "https://user:pw@hooks.example.org/x",
            "file:///etc/passwd",
            "not a url",
        ] {
            assert!(webhook_url(bad, false).is_err(), "{bad}");
        }
        let ok = webhook_url("https://hooks.slack.com/services/T0/B0/secret", false).unwrap();
        assert_eq!(webhook_target(&ok), "https://hooks.slack.com");
        assert!(webhook_url("https://8.8.8.8/x", false).is_ok());
        assert!(
            webhook_url("http://127.0.0.1:9/x", true).is_ok(),
            "development"
        );
        assert!(
            webhook_url("http://hooks.example.org/x", true).is_err(),
            "plain HTTP only to loopback"
        );
        assert!(
            webhook_url("https://169.254.169.254/x", true).is_err(),
            "never the metadata service"
        );
        assert!(webhook_url("https://10.0.0.1/x", true).is_err());
        assert!(public_address("2606:4700::1111".parse().unwrap()));
        assert!(!public_address("0.1.2.3".parse().unwrap()));
    }

    #[test]
    fn ipv6_forms_that_carry_an_ipv4_address_are_judged_by_it() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        // Each form carrying an internal address (10.0.0.1 = 0a00:0001,
        // 127.0.0.1, 169.254.169.254 = a9fe:a9fe, 192.168.1.1 =
        // c0a8:0101), and the same form carrying a public one (8.8.8.8 =
        // 0808:0808).
        for (bad, good) in [
            ("::ffff:10.0.0.1", "::ffff:8.8.8.8"),          // IPv4-mapped
            ("::ffff:127.0.0.1", "::ffff:8.8.4.4"),         // mapped loopback
            ("::10.0.0.1", "::8.8.8.8"),                    // IPv4-compatible
            ("::169.254.169.254", "::1.1.1.1"),             // compatible metadata service
            ("::ffff:0:192.168.1.1", "::ffff:0:8.8.8.8"),   // IPv4-translated
            ("64:ff9b::10.0.0.1", "64:ff9b::8.8.8.8"),      // NAT64 well-known
            ("64:ff9b::a9fe:a9fe", "64:ff9b::808:808"),     // NAT64, hex
            ("2002:0a00:0001::1", "2002:0808:0808::1"),     // 6to4
            ("2002:a9fe:a9fe:1::2", "2002:0101:0101:1::2"), // 6to4 to the metadata service
            ("2002:7f00:0001::", "2002:0808:0404::"),       // 6to4 to loopback
            // Teredo: server 65.54.227.120 (4136:e378) with client
            // 10.0.0.1 inverted (f5ff:fffe); server 10.0.0.1 with a
            // public client (8.8.8.8 inverted: f7f7:f7f7).
            (
                "2001:0:4136:e378:8000:63bf:f5ff:fffe",
                "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
            ),
            (
                "2001:0:0a00:0001:8000:63bf:f7f7:f7f7",
                "2001:0:4136:e378::f7f7:f7f7",
            ),
        ] {
            assert!(!public_address(ip(bad)), "{bad} carries an internal IPv4");
            assert!(public_address(ip(good)), "{good} carries a public IPv4");
            for allow_loopback in [false, true] {
                assert!(
                    webhook_url(&format!("https://[{bad}]/hook"), allow_loopback).is_err(),
                    "{bad} as a webhook address"
                );
            }
            assert!(
                webhook_url(&format!("https://[{good}]/hook"), false).is_ok(),
                "{good}"
            );
        }
        // Site-local is never acceptable, whatever it carries; nor the
        // rest of NAT64's prefix, nor the reserved rest of ::/8.
        for bad in [
            "fec0::1",
            "fec0::808:808",
            "feff:ffff::1",
            "64:ff9b:1::808:808",
            "::1:0:0:808:808",
            "100::1",
            "2001:db8::1",
            "2001:2::1",
        ] {
            assert!(!public_address(ip(bad)), "{bad}");
        }
        assert!(
            !acceptable(ip("::ffff:127.0.0.1"), true),
            "loopback only as ::1 or 127/8"
        );
        assert!(acceptable(ip("::1"), true) && !acceptable(ip("::1"), false));
        // When a webhook is posted, every address its name resolves to is
        // checked the same way: an AAAA answer in such a form stops it.
        assert_eq!(
            unacceptable_among([ip("8.8.8.8"), ip("2002:0a00:0001::1")], false),
            Some(ip("2002:0a00:0001::1"))
        );
        assert_eq!(
            unacceptable_among([ip("2606:4700::1111"), ip("::ffff:169.254.169.254")], true),
            Some(ip("::ffff:169.254.169.254"))
        );
        assert_eq!(
            unacceptable_among([ip("8.8.8.8"), ip("64:ff9b::808:808")], false),
            None
        );
    }
}
