//! Server configuration: command-line options and `KUMO_*` variables over a
//! TOML file over defaults. Resolution is a pure function so that the
//! precedence is tested without touching the environment.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use vxlan_manager::state::MAX_VNI;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_DATA_DIR: &str = "./.kumo";
pub const DEFAULT_REQUEST_TIMEOUT_SECS: u64 = 30;
pub const DEFAULT_BODY_LIMIT_BYTES: usize = 1 << 20;
pub const DEFAULT_HEARTBEAT_TIMEOUT_SECS: u64 = 30;
/// Ten minutes: a host rebooting or briefly cut off comes back within it.
pub const DEFAULT_LOST_AFTER_SECS: u64 = 600;

/// Values given on the command line or through `KUMO_*` variables (clap
/// merges the two); `None` means "not given here".
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "KUMO_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, env = "KUMO_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Directory for the SQLite database and the bootstrap admin token [default: ./.kumo].
    #[arg(long, env = "KUMO_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// `sqlite://PATH` or `postgres://…` [default: sqlite://<data-dir>/kumo.db].
    #[arg(long, env = "KUMO_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Log format: `json` (default) or `text`.
    #[arg(long, env = "KUMO_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Text,
}

/// The TOML file. Unknown keys are an error so that a misspelt setting is
/// not silently ignored.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub database_url: Option<String>,
    pub log_format: Option<LogFormat>,
    #[serde(default)]
    pub http: HttpFileConfig,
    #[serde(default)]
    pub hosts: HostsFileConfig,
    #[serde(default)]
    pub scheduler: SchedulerFileConfig,
    #[serde(default)]
    pub network: NetworkFileConfig,
    #[serde(default)]
    pub billing: BillingFileConfig,
    #[serde(default)]
    pub auth: AuthFileConfig,
    #[serde(default)]
    pub health: HealthFileConfig,
    #[serde(default)]
    pub idle: IdleFileConfig,
    #[serde(default)]
    pub storage: StorageFileConfig,
    #[serde(default)]
    pub telemetry: TelemetryFileConfig,
    #[serde(default)]
    pub replicas: ReplicasFileConfig,
    #[serde(default)]
    pub queue: QueueFileConfig,
}

/// The fair queue (`queue` in a VM or cluster request).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueFileConfig {
    /// How long a request waits before it leaves the queue unplaced
    /// [default: 604800, a week].
    pub expire_after_seconds: Option<u64>,
    /// Requests (a VM, or a cluster) one project may have queued at once
    /// [default: 16].
    pub max_per_project: Option<u32>,
    /// How long the estimates take every VM to run (VMs have no end time
    /// of their own) [default: 86400, a day].
    pub assumed_runtime_seconds: Option<u64>,
}

/// The fair queue's settings, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    pub expire_after: Duration,
    pub max_per_project: u32,
    pub assumed_runtime: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            expire_after: Duration::from_secs(7 * 86_400),
            max_per_project: 16,
            assumed_runtime: Duration::from_secs(86_400),
        }
    }
}

fn queue(file: &QueueFileConfig) -> Result<QueueConfig, ConfigError> {
    let d = QueueConfig::default();
    let expire = file
        .expire_after_seconds
        .unwrap_or(d.expire_after.as_secs());
    if !(60..=90 * 86_400).contains(&expire) {
        return Err(ConfigError::Invalid {
            key: "queue.expire_after_seconds",
            message: "between 60 and 90 days (7776000)".into(),
        });
    }
    let max = file.max_per_project.unwrap_or(d.max_per_project);
    if !(1..=1000).contains(&max) {
        return Err(ConfigError::Invalid {
            key: "queue.max_per_project",
            message: "1 to 1000".into(),
        });
    }
    let runtime = file
        .assumed_runtime_seconds
        .unwrap_or(d.assumed_runtime.as_secs());
    if !(60..=365 * 86_400).contains(&runtime) {
        return Err(ConfigError::Invalid {
            key: "queue.assumed_runtime_seconds",
            message: "between 60 and a year (31536000)".into(),
        });
    }
    Ok(QueueConfig {
        expire_after: Duration::from_secs(expire),
        max_per_project: max,
        assumed_runtime: Duration::from_secs(runtime),
    })
}

/// Server replicas on one database (ARCHITECTURE.md): consoles whose
/// person and agent reach different replicas are relayed between them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicasFileConfig {
    /// Where the other replicas reach this one (`http://` or `https://`,
    /// host and port, no path) [default: http://<listen address>, with
    /// an unspecified address read as loopback].
    pub url: Option<String>,
    /// The key replicas prove themselves to each other with (32 bytes,
    /// hex); every replica needs the same [default:
    /// <data-dir>/replica.key, made on first start].
    pub key_file: Option<PathBuf>,
}

/// The replicas' settings, resolved.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReplicasConfig {
    /// `None`: derived from the address the server bound.
    pub url: Option<String>,
    pub key_file: Option<PathBuf>,
}

impl ReplicasConfig {
    /// Where the other replicas reach this one, the server bound to
    /// `bound`.
    pub fn url_for(&self, bound: SocketAddr) -> String {
        if let Some(u) = &self.url {
            return u.trim_end_matches('/').to_owned();
        }
        let ip = match bound.ip() {
            std::net::IpAddr::V4(v) if v.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(v) if v.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
            ip => ip,
        };
        format!("http://{}", SocketAddr::new(ip, bound.port()))
    }

    pub fn key_path(&self, data_dir: &Path) -> PathBuf {
        self.key_file
            .clone()
            .unwrap_or_else(|| data_dir.join("replica.key"))
    }
}

fn replicas(file: &ReplicasFileConfig) -> Result<ReplicasConfig, ConfigError> {
    if let Some(u) = &file.url {
        let bad = |message: &str| ConfigError::Invalid {
            key: "replicas.url",
            message: message.into(),
        };
        let parsed = url::Url::parse(u).map_err(|e| bad(&format!("not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(bad("an http:// or https:// URL"));
        }
        if parsed.host().is_none() {
            return Err(bad("needs a host"));
        }
        if !parsed.username().is_empty()
            || parsed.password().is_some()
            || parsed.query().is_some()
            || parsed.fragment().is_some()
            || parsed.path() != "/"
        {
            return Err(bad("scheme, host and port only"));
        }
    }
    Ok(ReplicasConfig {
        url: file.url.clone(),
        key_file: file.key_file.clone(),
    })
}

/// GPU telemetry from guests (docs/src/operator/device-health.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryFileConfig {
    /// Days GPU figures are kept by the minute; older ones are kept by the
    /// hour until the retention (30 days) [default: 7].
    pub minutes_days: Option<u32>,
}

/// GPU telemetry, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    pub minutes_days: u32,
}

impl Default for TelemetryConfig {
    fn default() -> TelemetryConfig {
        TelemetryConfig { minutes_days: 7 }
    }
}

fn telemetry(file: &TelemetryFileConfig) -> Result<TelemetryConfig, ConfigError> {
    let days = file
        .minutes_days
        .unwrap_or(TelemetryConfig::default().minutes_days);
    let most = u32::try_from(crate::domain::gpu_telemetry::RETENTION_DAYS).unwrap_or(30);
    if !(1..=most).contains(&days) {
        return Err(ConfigError::Invalid {
            key: "telemetry.minutes_days",
            message: format!("1 to {most} days"),
        });
    }
    Ok(TelemetryConfig { minutes_days: days })
}

/// Hosts' storage (docs/src/operator/storage.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageFileConfig {
    /// How many times its storage's capacity a host may provision (thin
    /// volumes, snapshots, root disks, copies): 1.0, the default, counts
    /// every GiB promised; more lets promises outrun the disks.
    pub overcommit: Option<f64>,
}

/// Hosts' storage, resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StorageConfig {
    /// See [`StorageFileConfig::overcommit`].
    pub overcommit: f64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig { overcommit: 1.0 }
    }
}

fn storage(file: &StorageFileConfig) -> Result<StorageConfig, ConfigError> {
    let overcommit = file.overcommit.unwrap_or(1.0);
    if !(overcommit.is_finite() && overcommit > 0.0 && overcommit <= 1000.0) {
        return Err(ConfigError::Invalid {
            key: "storage.overcommit",
            message: "a ratio above 0 and at most 1000 (1.0: no overcommit)".into(),
        });
    }
    Ok(StorageConfig { overcommit })
}

/// The platform's idle-GPU policy (docs/src/researcher/idle-gpus.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleFileConfig {
    /// A GPU below this utilisation (percent, minute mean) is idle
    /// [default: 5].
    pub utilization_pct: Option<f64>,
    /// Hours a VM's GPUs may all be idle before the action [default: 24].
    pub hours: Option<u32>,
    /// `notice` or `shelve` [default: notice].
    pub action: Option<kumo_api_types::IdleAction>,
    /// The longest exemption a project owner may give a VM, in days
    /// [default: 14].
    pub max_exemption_days: Option<u32>,
    /// The most exempt time one VM may have in all, renewals included, in
    /// days [default: 30].
    pub max_exempt_days_total: Option<u32>,
    /// Seconds between the idle passes [default: 60].
    pub check_every_secs: Option<u64>,
    /// The key webhooks' addresses are sealed with (32 bytes, hex); every
    /// replica needs the same [default: <data-dir>/webhook.key, made on
    /// first use].
    pub webhook_key_file: Option<PathBuf>,
    /// Webhooks may go to loopback over plain HTTP (development and tests
    /// only) [default: false].
    pub allow_loopback_webhooks: Option<bool>,
}

/// The idle-GPU policy and its webhooks, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct IdleConfig {
    pub policy: kumo_api_types::IdlePolicy,
    pub max_exemption_days: u32,
    /// The most exempt time one VM may have in all (owners' exemptions
    /// and renewals; administrators may go past it).
    pub max_exempt_days_total: u32,
    pub check_every: Duration,
    /// `None`: `<data-dir>/webhook.key`.
    pub webhook_key_file: Option<PathBuf>,
    pub allow_loopback_webhooks: bool,
}

impl Default for IdleConfig {
    fn default() -> IdleConfig {
        IdleConfig {
            policy: crate::domain::idle_gpus::PLATFORM_DEFAULT,
            max_exemption_days: 14,
            max_exempt_days_total: 30,
            check_every: Duration::from_secs(60),
            webhook_key_file: None,
            allow_loopback_webhooks: false,
        }
    }
}

/// The passed-through devices' health rules (docs/src/operator/device-health.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthFileConfig {
    /// A suspect device this long without a finding is healthy again
    /// [default: 3600].
    pub suspect_clears_after_secs: Option<u64>,
    /// Correctable PCIe errors a minute above which a device is suspect
    /// [default: 10].
    pub correctable_errors_per_minute: Option<f64>,
    /// Carrier changes between readings from which an RDMA port flaps
    /// [default: 4].
    pub carrier_flaps: Option<u64>,
    /// The share of the fleet's devices Kumo quarantines by itself; past
    /// it, it alerts and an operator decides [default: 0.1].
    pub max_quarantined_share: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthFileConfig {
    /// The address browsers reach Kumo at (for OpenID redirects and
    /// `Secure` cookies) [default: http://<listen>].
    pub public_url: Option<String>,
    /// The longest an API token may live, in days: a token asked for
    /// longer (or without an end) ends then [default: no limit].
    pub max_token_days: Option<u32>,
    #[serde(default)]
    pub oidc: Vec<OidcFileConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcFileConfig {
    pub name: String,
    pub display_name: String,
    pub issuer: String,
    pub client_id: String,
    pub client_secret_file: PathBuf,
    #[serde(default)]
    pub scopes: Vec<String>,
    /// E-mail domains allowed to log in (suffix match); all when empty.
    #[serde(default)]
    pub allowed_email_domains: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BillingFileConfig {
    /// Seconds between postings of running VMs' charges (1 to 60).
    pub post_interval_secs: Option<u64>,
    /// The points' currency label.
    pub currency: Option<String>,
    /// Percentages of a grant spent that raise an alert.
    pub alert_thresholds: Option<Vec<u32>>,
    /// Seconds guaranteed VMs keep running once points are exhausted.
    pub guaranteed_grace_secs: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkFileConfig {
    /// VNIs segments are given, as `"FIRST-LAST"` strings.
    pub vni_ranges: Option<Vec<String>>,
    /// The hosts' underlay MTU; segments get it minus VXLAN's 50 bytes.
    pub underlay_mtu: Option<u32>,
    /// How long a deleted segment's VNI rests before it is handed out again.
    pub vni_quarantine_secs: Option<u64>,
    /// How long a released public address (a tenant's, or a segment's
    /// egress address) rests before it is handed out again.
    pub public_ip_quarantine_secs: Option<u64>,
    /// Changes to shared hosts (edges, addresses attached, segments'
    /// egress, ingress and forwards) one tenant may make a minute …
    pub tenant_changes_per_minute: Option<u32>,
    /// … and at once.
    pub tenant_changes_burst: Option<u32>,
    /// VLANs RoCE segments are given (`"FIRST-LAST"`): the leaf switches
    /// map each to its segment's VNI.
    pub roce_vlans: Option<String>,
    /// The IPv4 ranges tenant segments' CIDRs must lie in (default: the
    /// RFC 1918 blocks and 100.64.0.0/10).
    pub tenant_ranges: Option<Vec<String>>,
    /// Each new tenant's first segment: an Ethernet segment named
    /// `default` on this network, which `kumo vm create` uses when given
    /// no `--network`. Unset or `""`: none.
    pub default_segment: Option<String>,
    /// Whether that segment has egress (default: yes, when the tenant
    /// can hold its address; else it is made without).
    pub default_segment_egress: Option<bool>,
}

/// The segment every new tenant gets (`[network] default_segment`).
#[derive(Debug, Clone, PartialEq)]
pub struct DefaultSegment {
    pub cidr: String,
    pub egress: bool,
}

/// VNIs below this are the infrastructure's (0 is invalid in VXLAN).
pub const FIRST_TENANT_VNI: u32 = 4096;
pub const DEFAULT_UNDERLAY_MTU: u32 = 9000;
pub const DEFAULT_VNI_QUARANTINE_SECS: u64 = 600;
/// A day: DNS records, allowlists and connections aimed at a released
/// address's last holder fade before anyone else gets it.
pub const DEFAULT_PUBLIC_IP_QUARANTINE_SECS: u64 = 86_400;
pub const DEFAULT_ROCE_VLANS: std::ops::RangeInclusive<u16> = 100..=3999;

/// Tenant networks, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfig {
    pub vni_ranges: Vec<std::ops::RangeInclusive<u32>>,
    pub underlay_mtu: u32,
    pub vni_quarantine: Duration,
    pub public_ip_quarantine: Duration,
    /// Each tenant's allowance of changes that reprogram shared hosts.
    pub tenant_changes: crate::domain::churn::Allowance,
    pub roce_vlans: std::ops::RangeInclusive<u16>,
    pub tenant_ranges: Vec<crate::domain::ipam::Cidr>,
    pub default_segment: Option<DefaultSegment>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            vni_ranges: vec![FIRST_TENANT_VNI..=MAX_VNI],
            underlay_mtu: DEFAULT_UNDERLAY_MTU,
            vni_quarantine: Duration::from_secs(DEFAULT_VNI_QUARANTINE_SECS),
            public_ip_quarantine: Duration::from_secs(DEFAULT_PUBLIC_IP_QUARANTINE_SECS),
            tenant_changes: crate::domain::churn::Allowance::default(),
            roce_vlans: DEFAULT_ROCE_VLANS,
            tenant_ranges: crate::domain::ipam::default_tenant_ranges(),
            default_segment: None,
        }
    }
}

fn network(file: &NetworkFileConfig) -> Result<NetworkConfig, ConfigError> {
    let mut out = NetworkConfig::default();
    if let Some(ranges) = &file.vni_ranges {
        let bad = |message: String| ConfigError::Invalid {
            key: "network.vni_ranges",
            message,
        };
        out.vni_ranges.clear();
        for r in ranges {
            let (a, b) = r
                .split_once('-')
                .ok_or_else(|| bad(format!("{r:?} is not FIRST-LAST")))?;
            let (a, b): (u32, u32) = match (a.trim().parse(), b.trim().parse()) {
                (Ok(a), Ok(b)) => (a, b),
                _ => return Err(bad(format!("{r:?} is not FIRST-LAST"))),
            };
            if a > b || a < FIRST_TENANT_VNI || b > MAX_VNI {
                return Err(bad(format!(
                    "{r:?} must lie within {FIRST_TENANT_VNI}-{MAX_VNI} (lower VNIs are reserved)"
                )));
            }
            if out
                .vni_ranges
                .iter()
                .any(|x| a <= *x.end() && *x.start() <= b)
            {
                return Err(bad(format!("{r:?} overlaps another range")));
            }
            out.vni_ranges.push(a..=b);
        }
        if out.vni_ranges.is_empty() {
            return Err(bad("at least one range".into()));
        }
        out.vni_ranges.sort_by_key(|r| *r.start());
    }
    if let Some(m) = file.underlay_mtu {
        if !(1280..=9216).contains(&m) {
            return Err(ConfigError::Invalid {
                key: "network.underlay_mtu",
                message: "between 1280 and 9216".into(),
            });
        }
        out.underlay_mtu = m;
    }
    if let Some(q) = file.vni_quarantine_secs {
        out.vni_quarantine = Duration::from_secs(q);
    }
    if let Some(n) = file.tenant_changes_per_minute {
        out.tenant_changes.per_minute = n;
    }
    if let Some(n) = file.tenant_changes_burst {
        if n == 0 {
            return Err(ConfigError::Invalid {
                key: "network.tenant_changes_burst",
                message: "at least 1".into(),
            });
        }
        out.tenant_changes.burst = n;
    }
    if let Some(q) = file.public_ip_quarantine_secs {
        out.public_ip_quarantine = Duration::from_secs(q);
    }
    if let Some(r) = &file.roce_vlans {
        let range = r
            .split_once('-')
            .and_then(|(a, b)| Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?)))
            .filter(|(a, b)| 2 <= *a && a <= b && *b <= 4094)
            .ok_or_else(|| ConfigError::Invalid {
                key: "network.roce_vlans",
                message: format!("{r:?}: expected FIRST-LAST within 2-4094"),
            })?;
        out.roce_vlans = range.0..=range.1;
    }
    if let Some(ranges) = &file.tenant_ranges {
        let bad = |message: String| ConfigError::Invalid {
            key: "network.tenant_ranges",
            message,
        };
        out.tenant_ranges = ranges
            .iter()
            .map(|r| {
                crate::domain::ipam::Cidr::parse("tenant_ranges", r)
                    .map_err(|e| bad(format!("{r:?}: {e}")))
            })
            .collect::<Result<_, _>>()?;
        if out.tenant_ranges.is_empty() {
            return Err(bad("at least one range".into()));
        }
    }
    if let Some(cidr) = file.default_segment.as_deref().filter(|c| !c.is_empty()) {
        crate::domain::ipam::Cidr::for_tenant("default_segment", cidr, &out.tenant_ranges)
            .map_err(|e| ConfigError::Invalid {
                key: "network.default_segment",
                message: e.to_string(),
            })?;
        out.default_segment = Some(DefaultSegment {
            cidr: cidr.to_owned(),
            egress: file.default_segment_egress.unwrap_or(true),
        });
    } else if file.default_segment_egress.is_some() {
        return Err(ConfigError::Invalid {
            key: "network.default_segment_egress",
            message: "needs network.default_segment".into(),
        });
    }
    Ok(out)
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerFileConfig {
    /// How long a reclaimed spot VM's guest has between the notice and
    /// being shut down (or suspended).
    pub preemption_grace_secs: Option<u64>,
    /// The longest notice a VM may ask for (`notice_seconds`): before a
    /// spot reclaim, and before a maintenance window acts on it.
    pub max_notice_secs: Option<u64>,
}

pub const DEFAULT_PREEMPTION_GRACE_SECS: u64 = 30;
/// Half an hour: room to checkpoint a large model.
pub const DEFAULT_MAX_NOTICE_SECS: u64 = 1800;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpFileConfig {
    pub request_timeout_secs: Option<u64>,
    pub body_limit_bytes: Option<usize>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostsFileConfig {
    /// A host whose agent is silent this long becomes `unreachable`.
    pub heartbeat_timeout_secs: Option<u64>,
    /// A host unreachable this long is lost: its VMs become `lost` (or are
    /// recreated elsewhere when they asked for it).
    pub lost_after_secs: Option<u64>,
}

/// Everything the server needs, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub database_url: String,
    pub log_format: LogFormat,
    pub request_timeout: Duration,
    pub body_limit_bytes: usize,
    pub heartbeat_timeout: Duration,
    /// How long a host stays unreachable before its VMs are `lost`.
    pub lost_after: Duration,
    pub preemption_grace: Duration,
    /// The longest reclaim notice a spot VM may ask for.
    pub max_notice: Duration,
    pub network: NetworkConfig,
    pub billing: BillingConfig,
    pub auth: AuthConfig,
    pub device_health: crate::domain::device_health::Policy,
    pub idle: IdleConfig,
    pub storage: StorageConfig,
    pub telemetry: TelemetryConfig,
    pub replicas: ReplicasConfig,
    pub queue: QueueConfig,
    /// What metering and charging take as now.
    pub clock: crate::clock::Clock,
}

/// Federated login, resolved (client secrets read from their files).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AuthConfig {
    /// Where browsers reach Kumo; `None`: `http://<listen address>`.
    pub public_url: Option<String>,
    pub oidc: Vec<OidcProvider>,
    /// The longest an API token may live.
    pub max_token_lifetime: Option<chrono::Duration>,
}

#[derive(Clone, PartialEq)]
pub struct OidcProvider {
    pub name: String,
    pub display_name: String,
    pub issuer: String,
    pub client_id: String,
    pub client_secret: String,
    pub scopes: Vec<String>,
    pub allowed_email_domains: Vec<String>,
}

impl std::fmt::Debug for OidcProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcProvider")
            .field("name", &self.name)
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("client_secret", &"<redacted>")
            .finish()
    }
}

fn auth(file: &AuthFileConfig) -> Result<AuthConfig, ConfigError> {
    let mut out = AuthConfig {
        public_url: file.public_url.clone(),
        oidc: Vec::new(),
        max_token_lifetime: None,
    };
    if let Some(d) = file.max_token_days {
        if !(1..=3650).contains(&d) {
            return Err(ConfigError::Invalid {
                key: "auth.max_token_days",
                message: "between 1 and 3650".into(),
            });
        }
        out.max_token_lifetime = Some(chrono::Duration::days(i64::from(d)));
    }
    if let Some(u) = &out.public_url {
        if !(u.starts_with("http://") || u.starts_with("https://")) {
            return Err(ConfigError::Invalid {
                key: "auth.public_url",
                message: "an http:// or https:// URL".into(),
            });
        }
    }
    for p in &file.oidc {
        let bad = |message: String| ConfigError::Invalid {
            key: "auth.oidc",
            message: format!("{}: {message}", p.name),
        };
        if !crate::domain::names::is_tenant_name(&p.name) {
            return Err(bad("name: lowercase letters, digits and dashes".into()));
        }
        if out.oidc.iter().any(|o| o.name == p.name) {
            return Err(bad("named twice".into()));
        }
        if !(p.issuer.starts_with("https://") || p.issuer.starts_with("http://")) {
            return Err(bad("issuer: an https:// URL".into()));
        }
        let secret = std::fs::read_to_string(&p.client_secret_file).map_err(|e| {
            bad(format!(
                "client_secret_file {}: {e}",
                p.client_secret_file.display()
            ))
        })?;
        let mut scopes = p.scopes.clone();
        if !scopes.iter().any(|s| s == "openid") {
            scopes.insert(0, "openid".into());
        }
        out.oidc.push(OidcProvider {
            name: p.name.clone(),
            display_name: p.display_name.clone(),
            issuer: p.issuer.trim_end_matches('/').to_owned(),
            client_id: p.client_id.clone(),
            client_secret: secret.trim().to_owned(),
            scopes,
            allowed_email_domains: p
                .allowed_email_domains
                .iter()
                .map(|d| d.trim_start_matches('.').to_lowercase())
                .collect(),
        });
    }
    Ok(out)
}

/// Metering and points, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct BillingConfig {
    /// How often charges of running VMs are posted.
    pub post_interval: Duration,
    /// What points are called (1 point = ¥1 by default).
    pub currency: String,
    /// Alerts when this share (%) of a tenant's latest grant is spent.
    pub alert_thresholds: Vec<u32>,
    /// Out of points, guaranteed VMs run this long before they stop.
    pub guaranteed_grace: Duration,
}

impl Default for BillingConfig {
    fn default() -> Self {
        BillingConfig {
            post_interval: Duration::from_secs(DEFAULT_POST_INTERVAL_SECS),
            currency: "JPY".into(),
            alert_thresholds: vec![80, 100],
            guaranteed_grace: Duration::from_secs(DEFAULT_GUARANTEED_GRACE_SECS),
        }
    }
}

pub const DEFAULT_POST_INTERVAL_SECS: u64 = 15;
pub const DEFAULT_GUARANTEED_GRACE_SECS: u64 = 86_400;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting {key}: {message}")]
    Invalid { key: &'static str, message: String },
}

impl Config {
    /// Reads the file named by `args.config`, if any, and resolves.
    pub fn load(args: &ServeArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => parse_file(path)?,
            None => FileConfig::default(),
        };
        resolve(args, &file)
    }

    /// A configuration for tests and embedded use: everything under
    /// `data_dir`, listening on an ephemeral loopback port.
    pub fn for_data_dir(data_dir: &Path, database_url: Option<String>) -> Config {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: data_dir.to_path_buf(),
            database_url: database_url.unwrap_or_else(|| sqlite_url(data_dir)),
            log_format: LogFormat::Json,
            request_timeout: Duration::from_secs(DEFAULT_REQUEST_TIMEOUT_SECS),
            body_limit_bytes: DEFAULT_BODY_LIMIT_BYTES,
            heartbeat_timeout: Duration::from_secs(DEFAULT_HEARTBEAT_TIMEOUT_SECS),
            lost_after: Duration::from_secs(DEFAULT_LOST_AFTER_SECS),
            max_notice: Duration::from_secs(DEFAULT_MAX_NOTICE_SECS),
            preemption_grace: Duration::from_secs(DEFAULT_PREEMPTION_GRACE_SECS),
            network: NetworkConfig::default(),
            billing: BillingConfig::default(),
            auth: AuthConfig::default(),
            device_health: Default::default(),
            idle: IdleConfig::default(),
            storage: StorageConfig::default(),
            telemetry: TelemetryConfig::default(),
            replicas: ReplicasConfig::default(),
            queue: QueueConfig::default(),
            clock: crate::clock::Clock::default(),
        }
    }
}

pub fn parse_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn sqlite_url(data_dir: &Path) -> String {
    format!("sqlite://{}?mode=rwc", data_dir.join("kumo.db").display())
}

/// Command line and environment win over the file, the file over defaults.
pub fn resolve(args: &ServeArgs, file: &FileConfig) -> Result<Config, ConfigError> {
    let listen = match args.listen.or(file.listen) {
        Some(l) => l,
        None => DEFAULT_LISTEN
            .parse()
            .map_err(|e: std::net::AddrParseError| ConfigError::Invalid {
                key: "listen",
                message: e.to_string(),
            })?,
    };
    let data_dir = args
        .data_dir
        .clone()
        .or_else(|| file.data_dir.clone())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
    let database_url = args
        .database_url
        .clone()
        .or_else(|| file.database_url.clone())
        .unwrap_or_else(|| sqlite_url(&data_dir));
    if !(database_url.starts_with("sqlite:")
        || database_url.starts_with("postgres://")
        || database_url.starts_with("postgresql://"))
    {
        return Err(ConfigError::Invalid {
            key: "database_url",
            message: "must start with sqlite:, postgres:// or postgresql://".into(),
        });
    }
    let request_timeout_secs = file
        .http
        .request_timeout_secs
        .unwrap_or(DEFAULT_REQUEST_TIMEOUT_SECS);
    if request_timeout_secs == 0 {
        return Err(ConfigError::Invalid {
            key: "http.request_timeout_secs",
            message: "must be at least 1".into(),
        });
    }
    let body_limit_bytes = file
        .http
        .body_limit_bytes
        .unwrap_or(DEFAULT_BODY_LIMIT_BYTES);
    if body_limit_bytes < 1024 {
        return Err(ConfigError::Invalid {
            key: "http.body_limit_bytes",
            message: "must be at least 1024".into(),
        });
    }
    let heartbeat_timeout_secs = file
        .hosts
        .heartbeat_timeout_secs
        .unwrap_or(DEFAULT_HEARTBEAT_TIMEOUT_SECS);
    if heartbeat_timeout_secs < 2 {
        return Err(ConfigError::Invalid {
            key: "hosts.heartbeat_timeout_secs",
            message: "must be at least 2".into(),
        });
    }
    let lost_after_secs = file
        .hosts
        .lost_after_secs
        .unwrap_or(DEFAULT_LOST_AFTER_SECS.max(heartbeat_timeout_secs));
    if !(heartbeat_timeout_secs..=7 * 86_400).contains(&lost_after_secs) {
        return Err(ConfigError::Invalid {
            key: "hosts.lost_after_secs",
            message: "between hosts.heartbeat_timeout_secs and a week (604800)".into(),
        });
    }
    let grace = file
        .scheduler
        .preemption_grace_secs
        .unwrap_or(DEFAULT_PREEMPTION_GRACE_SECS);
    if grace > 86_400 {
        return Err(ConfigError::Invalid {
            key: "scheduler.preemption_grace_secs",
            message: "at most 86400".into(),
        });
    }
    let max_notice_secs = file
        .scheduler
        .max_notice_secs
        .unwrap_or(DEFAULT_MAX_NOTICE_SECS.max(grace));
    if !(grace..=86_400).contains(&max_notice_secs) {
        return Err(ConfigError::Invalid {
            key: "scheduler.max_notice_secs",
            message: "between scheduler.preemption_grace_secs and 86400".into(),
        });
    }
    Ok(Config {
        listen,
        data_dir,
        database_url,
        log_format: args
            .log_format
            .or(file.log_format)
            .unwrap_or(LogFormat::Json),
        request_timeout: Duration::from_secs(request_timeout_secs),
        body_limit_bytes,
        heartbeat_timeout: Duration::from_secs(heartbeat_timeout_secs),
        lost_after: Duration::from_secs(lost_after_secs),
        max_notice: Duration::from_secs(max_notice_secs),
        preemption_grace: Duration::from_secs(grace),
        network: network(&file.network)?,
        billing: billing(&file.billing)?,
        auth: auth(&file.auth)?,
        device_health: device_health(&file.health)?,
        idle: idle(&file.idle)?,
        storage: storage(&file.storage)?,
        telemetry: telemetry(&file.telemetry)?,
        replicas: replicas(&file.replicas)?,
        queue: queue(&file.queue)?,
        clock: crate::clock::Clock::default(),
    })
}

fn idle(file: &IdleFileConfig) -> Result<IdleConfig, ConfigError> {
    let d = IdleConfig::default();
    let policy = kumo_api_types::IdlePolicy {
        utilization_pct: file.utilization_pct.unwrap_or(d.policy.utilization_pct),
        hours: file.hours.unwrap_or(d.policy.hours),
        action: file.action.unwrap_or(d.policy.action),
    };
    crate::domain::idle_gpus::validate(&policy).map_err(|(field, why)| ConfigError::Invalid {
        key: "idle",
        message: format!("{field}: {why}"),
    })?;
    let check = file.check_every_secs.unwrap_or(60);
    if !(1..=3600).contains(&check) {
        return Err(ConfigError::Invalid {
            key: "idle.check_every_secs",
            message: "1 to 3600".into(),
        });
    }
    let total = file
        .max_exempt_days_total
        .unwrap_or(d.max_exempt_days_total);
    if total > 3650 {
        return Err(ConfigError::Invalid {
            key: "idle.max_exempt_days_total",
            message: "0 to 3650 days".into(),
        });
    }
    Ok(IdleConfig {
        policy,
        max_exemption_days: file.max_exemption_days.unwrap_or(d.max_exemption_days),
        max_exempt_days_total: total,
        check_every: Duration::from_secs(check),
        webhook_key_file: file.webhook_key_file.clone(),
        allow_loopback_webhooks: file.allow_loopback_webhooks.unwrap_or(false),
    })
}

fn device_health(
    file: &HealthFileConfig,
) -> Result<crate::domain::device_health::Policy, ConfigError> {
    let mut out = crate::domain::device_health::Policy::default();
    if let Some(s) = file.suspect_clears_after_secs {
        out.suspect_clears_after_secs = i64::try_from(s).unwrap_or(i64::MAX);
    }
    if let Some(r) = file.correctable_errors_per_minute {
        if !(r.is_finite() && r >= 0.0) {
            return Err(ConfigError::Invalid {
                key: "health.correctable_errors_per_minute",
                message: "a rate of 0 or more".into(),
            });
        }
        out.correctable_per_minute = r;
    }
    if let Some(f) = file.carrier_flaps {
        out.carrier_flaps = f.max(1);
    }
    if let Some(share) = file.max_quarantined_share {
        if !(0.0..=1.0).contains(&share) {
            return Err(ConfigError::Invalid {
                key: "health.max_quarantined_share",
                message: "between 0 and 1".into(),
            });
        }
        out.max_quarantined_share = share;
    }
    Ok(out)
}

fn billing(file: &BillingFileConfig) -> Result<BillingConfig, ConfigError> {
    let mut out = BillingConfig::default();
    if let Some(s) = file.post_interval_secs {
        if !(1..=60).contains(&s) {
            return Err(ConfigError::Invalid {
                key: "billing.post_interval_secs",
                message: "between 1 and 60: charges are posted at least every minute".into(),
            });
        }
        out.post_interval = Duration::from_secs(s);
    }
    if let Some(c) = &file.currency {
        if c.is_empty() || c.len() > 16 {
            return Err(ConfigError::Invalid {
                key: "billing.currency",
                message: "1 to 16 characters".into(),
            });
        }
        out.currency = c.clone();
    }
    if let Some(t) = &file.alert_thresholds {
        if t.len() > 10 || t.iter().any(|p| *p == 0 || *p > 1000) {
            return Err(ConfigError::Invalid {
                key: "billing.alert_thresholds",
                message: "at most 10 percentages, 1 to 1000".into(),
            });
        }
        out.alert_thresholds = t.clone();
    }
    if let Some(g) = file.guaranteed_grace_secs {
        out.guaranteed_grace = Duration::from_secs(g);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oidc_providers_read_their_secret_files() {
        let dir = std::env::temp_dir().join(format!("kumo-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let secret = dir.join("uni.secret");
        std::fs::write(&secret, "s3cret\n").unwrap_or_default();
        let toml = |issuer: &str, file: &std::path::Path| {
            format!(
                "[auth]\npublic_url = \"https://kumo.example\"\n[[auth.oidc]]\nname = \"example-university\"\ndisplay_name = \"Example University\"\nissuer = \"{issuer}\"\nclient_id = \"kumo\"\nclient_secret_file = \"{}\"\nscopes = [\"email\"]\nallowed_email_domains = [\".ac.jp\"]\n",
                file.display()
            )
        };
        let parse = |t: String| {
            toml::from_str::<FileConfig>(&t)
                .map_err(|e| e.to_string())
                .and_then(|f| resolve(&ServeArgs::default(), &f).map_err(|e| e.to_string()))
        };
        let c =
            parse(toml("https://idp.example.ac.jp/", &secret)).unwrap_or_else(|e| panic!("{e}"));
        let p = &c.auth.oidc[0];
        assert_eq!(p.client_secret, "s3cret");
        assert_eq!(p.issuer, "https://idp.example.ac.jp");
        assert_eq!(p.scopes, ["openid", "email"]);
        assert_eq!(p.allowed_email_domains, ["ac.jp"]);
        assert!(
            !format!("{p:?}").contains("s3cret"),
            "secrets stay out of logs"
        );
        let e = parse(toml("ftp://idp", &secret)).unwrap_err();
        assert!(e.contains("issuer"), "{e}");
        let e = parse(toml("https://idp", &dir.join("missing"))).unwrap_err();
        assert!(e.contains("client_secret_file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn defaults_put_sqlite_in_the_data_dir() {
        let c = resolve(&ServeArgs::default(), &FileConfig::default()).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.data_dir, PathBuf::from("./.kumo"));
        assert_eq!(c.database_url, "sqlite://./.kumo/kumo.db?mode=rwc");
        assert_eq!(c.log_format, LogFormat::Json);
    }

    #[test]
    fn a_replica_url_is_scheme_host_and_port_and_defaults_to_the_bound_address() {
        let parse = |t: &str| resolve(&ServeArgs::default(), &toml::from_str(t).unwrap());
        let bound: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let c = parse("").unwrap();
        assert_eq!(c.replicas.url_for(bound), "http://127.0.0.1:8080");
        assert_eq!(
            c.replicas.url_for("[::]:9000".parse().unwrap()),
            "http://[::1]:9000"
        );
        assert_eq!(
            c.replicas.url_for("10.0.0.5:8080".parse().unwrap()),
            "http://10.0.0.5:8080"
        );
        assert_eq!(
            c.replicas.key_path(Path::new("/var/lib/kumo")),
            PathBuf::from("/var/lib/kumo/replica.key")
        );
        let c = parse("[replicas]\nurl = \"https://kumo-1.internal:8443/\"").unwrap();
        assert_eq!(c.replicas.url_for(bound), "https://kumo-1.internal:8443");
        for bad in [
            "ftp://kumo-1",
            "kumo-1:8080",
            "http://kumo-1/api",
            "http://kumo-1?x=1",
            "http://user:pw@kumo-1",
        ] {
            let e = parse(&format!("[replicas]\nurl = \"{bad}\"")).unwrap_err();
            assert!(e.to_string().contains("replicas.url"), "{bad}: {e}");
        }
    }

    #[test]
    fn hosts_are_lost_after_the_heartbeat_timeout_and_within_a_week() {
        let parse = |t: &str| resolve(&ServeArgs::default(), &toml::from_str(t).unwrap());
        assert_eq!(parse("").unwrap().lost_after, Duration::from_secs(600));
        let c = parse("[hosts]\nheartbeat_timeout_secs = 900\n").unwrap();
        assert_eq!(
            c.lost_after,
            Duration::from_secs(900),
            "never before the timeout"
        );
        assert!(parse("[hosts]\nlost_after_secs = 10\n").is_err());
        assert!(parse("[hosts]\nlost_after_secs = 700000\n").is_err());
        let c = parse("[hosts]\nlost_after_secs = 3600\n").unwrap();
        assert_eq!(c.lost_after, Duration::from_secs(3600));
    }

    #[test]
    fn a_vm_may_ask_for_a_longer_notice_within_the_platform_bound() {
        let parse = |t: &str| resolve(&ServeArgs::default(), &toml::from_str(t).unwrap());
        assert_eq!(parse("").unwrap().max_notice, Duration::from_secs(1800));
        assert!(parse("[scheduler]\npreemption_grace_secs = 60\nmax_notice_secs = 30\n").is_err());
        assert!(parse("[scheduler]\nmax_notice_secs = 90000\n").is_err());
    }

    #[test]
    fn the_queue_settings_are_bounded() {
        let parse = |t: &str| resolve(&ServeArgs::default(), &toml::from_str(t).unwrap());
        assert!(parse("[queue]\nmax_per_project = 0\n").is_err());
        assert!(parse("[queue]\nexpire_after_seconds = 5\n").is_err());
        assert!(parse("[queue]\nassumed_runtime_seconds = 1\n").is_err());
        let q = parse("[queue]\nmax_per_project = 3\nexpire_after_seconds = 3600\n")
            .unwrap()
            .queue;
        assert_eq!(
            (q.max_per_project, q.expire_after),
            (3, Duration::from_secs(3600))
        );
        assert_eq!(q.assumed_runtime, Duration::from_secs(86_400));
    }

    #[test]
    fn storage_overcommit_is_a_sane_ratio() {
        let parse = |t: &str| resolve(&ServeArgs::default(), &toml::from_str(t).unwrap());
        assert_eq!(parse("").unwrap().storage.overcommit, 1.0);
        assert_eq!(
            parse("[storage]\novercommit = 2.5")
                .unwrap()
                .storage
                .overcommit,
            2.5
        );
        for bad in ["0.0", "-1.0", "1001.0", "nan", "inf"] {
            let e = parse(&format!("[storage]\novercommit = {bad}")).unwrap_err();
            assert!(e.to_string().contains("storage.overcommit"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_default_segment_lies_in_the_tenant_ranges() {
        let parse = |t: &str| resolve(&ServeArgs::default(), &toml::from_str(t).unwrap());
        assert_eq!(parse("").unwrap().network.default_segment, None);
        assert_eq!(
            parse("[network]\ndefault_segment = \"\"")
                .unwrap()
                .network
                .default_segment,
            None
        );
        let c = parse("[network]\ndefault_segment = \"10.0.0.0/24\"").unwrap();
        assert_eq!(
            c.network.default_segment,
            Some(DefaultSegment {
                cidr: "10.0.0.0/24".into(),
                egress: true
            })
        );
        let c =
            parse("[network]\ndefault_segment = \"10.0.0.0/24\"\ndefault_segment_egress = false")
                .unwrap();
        assert!(!c.network.default_segment.unwrap().egress);
        for bad in [
            "default_segment = \"8.8.8.0/24\"",
            "default_segment = \"10.0.0.0\"",
            "tenant_ranges = [\"10.200.0.0/16\"]\ndefault_segment = \"10.0.0.0/24\"",
        ] {
            let e = parse(&format!("[network]\n{bad}")).unwrap_err();
            assert!(
                e.to_string().contains("network.default_segment"),
                "{bad}: {e}"
            );
        }
        let e = parse("[network]\ndefault_segment_egress = true").unwrap_err();
        assert!(
            e.to_string().contains("needs network.default_segment"),
            "{e}"
        );
    }

    #[test]
    fn vni_ranges_are_checked() {
        let parse = |t: &str| resolve(&ServeArgs::default(), &toml::from_str(t).unwrap());
        let c =
            parse("[network]\nvni_ranges = [\"20000-20999\", \"5000-5999\"]\nunderlay_mtu = 1500")
                .unwrap();
        assert_eq!(c.network.vni_ranges, vec![5000..=5999, 20000..=20999]);
        assert_eq!(c.network.underlay_mtu, 1500);
        assert_eq!(
            c.network.tenant_ranges,
            crate::domain::ipam::default_tenant_ranges()
        );
        let c = parse("[network]\ntenant_ranges = [\"10.200.0.0/16\"]").unwrap();
        assert_eq!(c.network.tenant_ranges.len(), 1);
        for bad in [
            "[]",
            "[\"10.0.0.0\"]",
            "[\"999.0.0.0/8\"]",
            "[\"0.0.0.0/0\"]",
        ] {
            let e = parse(&format!("[network]\ntenant_ranges = {bad}")).unwrap_err();
            assert!(
                e.to_string().contains("network.tenant_ranges"),
                "{bad}: {e}"
            );
        }
        for bad in [
            "[\"0-100\"]",
            "[\"5000\"]",
            "[\"6000-5000\"]",
            "[\"5000-6000\", \"5500-7000\"]",
            "[\"5000-16777216\"]",
            "[]",
        ] {
            let e = parse(&format!("[network]\nvni_ranges = {bad}")).unwrap_err();
            assert!(e.to_string().contains("network.vni_ranges"), "{bad}: {e}");
        }
    }

    #[test]
    fn command_line_wins_over_file() {
        let file: FileConfig = toml::from_str(
            r#"
            listen = "0.0.0.0:9000"
            data_dir = "/var/lib/kumo"
            [http]
            request_timeout_secs = 5
            "#,
        )
        .unwrap();
        let args = ServeArgs {
            listen: Some("127.0.0.1:7000".parse().unwrap()),
            ..ServeArgs::default()
        };
        let c = resolve(&args, &file).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:7000");
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/kumo"));
        assert_eq!(c.database_url, "sqlite:///var/lib/kumo/kumo.db?mode=rwc");
        assert_eq!(c.request_timeout, Duration::from_secs(5));
    }

    #[test]
    fn unknown_file_keys_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kumo.toml");
        std::fs::write(&path, "listn = \"127.0.0.1:1\"\n").unwrap();
        let err = parse_file(&path).unwrap_err().to_string();
        assert!(err.contains("unknown field `listn`"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let args = ServeArgs {
            database_url: Some("mysql://x".into()),
            ..ServeArgs::default()
        };
        let err = resolve(&args, &FileConfig::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("database_url"), "{err}");
        let file: FileConfig = toml::from_str("[http]\nbody_limit_bytes = 10\n").unwrap();
        let err = resolve(&ServeArgs::default(), &file)
            .unwrap_err()
            .to_string();
        assert!(err.contains("http.body_limit_bytes"), "{err}");
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let err = parse_file(Path::new("/nonexistent/kumo.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/kumo.toml"), "{err}");
    }
}
