//! The researchers' web portal as pure renderers: each page is an askama
//! template over a plain view model, in the request's language. The server
//! gathers the data (with the API's authorization) and serves the HTML;
//! the pages work without JavaScript.

pub mod diagram;
pub mod fleet_health;
pub mod gpu_chart;
pub mod i18n;
pub mod listing;

use askama::Template;

use i18n::{t, Lang, Msg};

/// An institution on the chooser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderItem {
    pub name: String,
    pub display_name: String,
}

/// One of the user's tenants on the dashboard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantCard {
    pub name: String,
    pub display_name: String,
    pub role: String,
    pub vms: u64,
    pub gpus_used: u64,
    pub gpus_quota: u64,
    /// `None` for a tenant not run on points.
    pub balance: Option<String>,
}

/// Who is signed in, for the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Viewer {
    pub display_name: String,
    pub csrf: String,
    /// Administrators see the admin pages in the navigation.
    pub is_admin: bool,
}

/// The portal's own script: live state updates on pages that ask for them
/// (an element `#live` with `data-src`); every page works without it.
pub const PORTAL_JS: &str = include_str!("portal.js");
/// The console page's script: xterm.js on the console's websocket, the
/// send-text box, Ctrl-Alt-Del, taking over.
pub const CONSOLE_JS: &str = include_str!("console.js");
/// xterm.js and its style sheet, from npm (see `build.rs`); empty when the
/// build had none.
pub const XTERM_JS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xterm.js"));
pub const XTERM_CSS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xterm.css"));
/// The chooser's filter and memory of the last provider (a file of its
/// own, so the pages' Content-Security-Policy allows no inline script).
pub const LOGIN_JS: &str = include_str!("login.js");

#[derive(Template)]
#[template(path = "layout.html")]
struct Layout<'a> {
    lang_code: &'a str,
    other_lang: &'a str,
    language: &'a str,
    title: &'a str,
    app_name: &'a str,
    user: Option<&'a str>,
    csrf: &'a str,
    sign_out: &'a str,
    nav: Vec<(String, &'a str)>,
    tenant: Option<&'a str>,
    tenant_nav: Vec<(String, &'a str)>,
    body: &'a str,
}

/// The layout around a page's body; `tenant` adds that project's pages to
/// the navigation.
fn page(
    lang: Lang,
    title: &str,
    viewer: Option<&Viewer>,
    tenant: Option<&str>,
    body: &str,
) -> String {
    let mut nav = Vec::new();
    if let Some(v) = viewer {
        nav.push(("/".to_owned(), t(lang, Msg::Dashboard)));
        nav.push(("/tokens".to_owned(), t(lang, Msg::Tokens)));
        if v.is_admin {
            nav.push(("/admin/hosts".to_owned(), t(lang, Msg::Hosts)));
            nav.push(("/admin/devices".to_owned(), t(lang, Msg::FleetHealth)));
            nav.push(("/admin/tenants".to_owned(), t(lang, Msg::Tenants)));
            nav.push(("/admin/rates".to_owned(), t(lang, Msg::Rates)));
            nav.push(("/admin/join-tokens".to_owned(), t(lang, Msg::JoinTokens)));
        }
    }
    let tenant_nav = tenant
        .filter(|_| viewer.is_some())
        .map(|tn| {
            [
                ("vms", Msg::VmsTitle),
                ("clusters", Msg::Clusters),
                ("segments", Msg::Segments),
                ("volumes", Msg::Volumes),
                ("shares", Msg::Shares),
                ("billing", Msg::Billing),
                ("members", Msg::Members),
            ]
            .into_iter()
            .map(|(p, m)| (format!("/t/{tn}/{p}"), t(lang, m)))
            .collect()
        })
        .unwrap_or_default();
    Layout {
        lang_code: lang.code(),
        other_lang: match lang {
            Lang::En => "ja",
            Lang::Ja => "en",
        },
        language: t(lang, Msg::Language),
        title,
        app_name: t(lang, Msg::AppName),
        user: viewer.map(|v| v.display_name.as_str()),
        csrf: viewer.map(|v| v.csrf.as_str()).unwrap_or(""),
        sign_out: t(lang, Msg::SignOut),
        nav,
        tenant: tenant.filter(|_| viewer.is_some()),
        tenant_nav,
        body,
    }
    .render()
    .unwrap_or_else(|e| format!("template error: {e}"))
}

#[derive(Template)]
#[template(path = "login.html")]
struct Login<'a> {
    sign_in: &'a str,
    choose: &'a str,
    search: &'a str,
    no_providers: &'a str,
    token_heading: &'a str,
    token_label: &'a str,
    csrf: &'a str,
    providers: &'a [ProviderItem],
    next: &'a str,
}

/// The institution chooser.
/// `csrf` guards the token form (a double-submitted cookie: there is no
/// session yet).
pub fn login_page(lang: Lang, providers: &[ProviderItem], next: &str, csrf: &str) -> String {
    let body = Login {
        csrf,
        sign_in: t(lang, Msg::SignIn),
        choose: t(lang, Msg::ChooseInstitution),
        search: t(lang, Msg::Search),
        no_providers: t(lang, Msg::NoProviders),
        token_heading: t(lang, Msg::SignInToken),
        token_label: t(lang, Msg::Token),
        providers,
        next,
    }
    .render()
    .unwrap_or_else(|e| format!("template error: {e}"));
    page(lang, t(lang, Msg::SignIn), None, None, &body)
}

#[derive(Template)]
#[template(path = "dashboard.html")]
struct Dashboard<'a> {
    heading: &'a str,
    my_tenants: &'a str,
    no_tenants: &'a str,
    role: &'a str,
    vms: &'a str,
    gpus: &'a str,
    points: &'a str,
    currency: &'a str,
    tenants: &'a [TenantCard],
    usage: &'a str,
    chart: &'a str,
    l_idle: &'a str,
    l_no_idle: &'a str,
    idle: Vec<(String, String, String)>,
}

/// The dashboard: the viewer's tenants with VMs, GPU use and points.
pub fn dashboard_page(
    lang: Lang,
    viewer: &Viewer,
    tenants: &[TenantCard],
    currency: &str,
    daily: &[(String, f64)],
    idle: &[IdleFlag],
) -> String {
    let chart = usage_chart(lang, currency, daily);
    let idle = idle
        .iter()
        .map(|f| {
            (
                f.tenant.clone(),
                f.vm.clone(),
                i18n::idle_sentence(lang, &f.note),
            )
        })
        .collect();
    let body = Dashboard {
        heading: t(lang, Msg::Dashboard),
        my_tenants: t(lang, Msg::MyTenants),
        no_tenants: t(lang, Msg::NoTenants),
        role: t(lang, Msg::Role),
        vms: t(lang, Msg::Vms),
        gpus: t(lang, Msg::Gpus),
        points: t(lang, Msg::Points),
        currency,
        tenants,
        usage: t(lang, Msg::Usage30),
        chart: &chart,
        l_idle: t(lang, Msg::IdleVms),
        l_no_idle: t(lang, Msg::NoIdleVms),
        idle,
    }
    .render()
    .unwrap_or_else(|e| format!("template error: {e}"));
    page(lang, t(lang, Msg::Dashboard), Some(viewer), None, &body)
}

#[derive(Template)]
#[template(path = "cli_login.html")]
struct CliLogin<'a> {
    heading: &'a str,
    ask: &'a str,
    allow: &'a str,
    csrf: &'a str,
    port: u16,
    state: &'a str,
}

/// The consent page of `kumo login`: a form (with the CSRF token) that
/// hands an API token to the command's loopback port.
pub fn cli_login_page(lang: Lang, viewer: &Viewer, port: u16, state: &str) -> String {
    let body = CliLogin {
        heading: t(lang, Msg::CliLogin),
        ask: t(lang, Msg::CliLoginAsk),
        allow: t(lang, Msg::Allow),
        csrf: &viewer.csrf,
        port,
        state,
    }
    .render()
    .unwrap_or_else(|e| format!("template error: {e}"));
    page(lang, t(lang, Msg::CliLogin), Some(viewer), None, &body)
}

#[derive(Template)]
#[template(path = "cli_handoff.html")]
struct CliHandoff<'a> {
    heading: &'a str,
    handoff: &'a str,
    go_on: &'a str,
    port: u16,
    state: &'a str,
    token: &'a str,
}

/// After consent: a form that posts the new token to the command's
/// loopback port in its body (the page's script submits it at once), so
/// the token never stands in a URL, the browser's history or a referrer.
pub fn cli_handoff_page(
    lang: Lang,
    viewer: &Viewer,
    port: u16,
    state: &str,
    token: &str,
) -> String {
    let body = CliHandoff {
        heading: t(lang, Msg::CliLogin),
        handoff: t(lang, Msg::CliHandoff),
        go_on: t(lang, Msg::Continue),
        port,
        state,
        token,
    }
    .render()
    .unwrap_or_else(|e| format!("template error: {e}"));
    page(lang, t(lang, Msg::CliLogin), Some(viewer), None, &body)
}

/// One VM on the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmRow {
    pub name: String,
    pub state: String,
    /// The state in the page's language (filled by `vms_page`).
    pub state_label: String,
    pub gpus: u32,
    pub host: String,
    /// The actions its state allows, with their labels (filled by
    /// `vms_page`).
    pub actions: Vec<(String, String)>,
}

/// What the VM form offers to choose from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VmChoices {
    /// GPU models with a price (any model when none is chosen).
    pub gpu_models: Vec<String>,
    /// OS templates (the server's default when none is chosen).
    pub templates: Vec<String>,
    /// The project's segments.
    pub segments: Vec<String>,
    /// The one the form starts on (the project's default segment).
    pub default_segment: Option<String>,
}

#[derive(Template)]
#[template(path = "vms.html")]
struct Vms<'a> {
    tenant: &'a str,
    heading: &'a str,
    error: Option<listing::ErrorSummary>,
    vms: &'a [VmRow],
    csrf: &'a str,
    l_name: &'a str,
    l_state: &'a str,
    l_host: &'a str,
    l_create: &'a str,
    l_no_vms: String,
    form: String,
}

/// The VM create form: what a VM is made of, each with what to enter.
pub fn vm_form(lang: Lang, tenant: &str, choices: &VmChoices) -> listing::Form {
    use listing::{Field, Input};
    let any = t(lang, Msg::Any);
    let help = |k| i18n::help(lang, k);
    listing::Form {
        action: format!("/t/{tenant}/vms"),
        submit: t(lang, Msg::Create).to_owned(),
        fields: vec![
            listing::name_field(lang),
            Field::new(
                "gpus",
                "GPUs",
                Input::Number {
                    min: 0,
                    max: Some(8),
                },
            )
            .help(help("gpus")),
            Field::new(
                "gpu_model",
                "GPU",
                Input::choices(any, choices.gpu_models.clone()),
            )
            .help(help("gpu_model")),
            Field::new("vcpus", "vCPUs", Input::Number { min: 1, max: None }).help(help("vcpus")),
            Field::new(
                "memory_gib",
                t(lang, Msg::Memory),
                Input::Number { min: 1, max: None },
            )
            .help(help("memory_gib")),
            Field::new(
                "template",
                t(lang, Msg::Template),
                Input::choices(any, choices.templates.clone()),
            )
            .help(help("template")),
            Field::new("spot", &i18n::word(lang, "Spot VM"), Input::Checkbox)
                .answers(&["service_level"])
                .help(help("spot")),
            Field {
                value: choices.default_segment.clone().unwrap_or_default(),
                ..Field::new(
                    "network",
                    t(lang, Msg::Segment),
                    Input::choices("—", choices.segments.clone()),
                )
                .answers(&["networks"])
                .help(help("network"))
            },
            Field::new(
                "public_ip",
                &i18n::word(lang, "Public address"),
                Input::Checkbox,
            )
            .help(help("public_ip")),
            Field::new("queue", &i18n::word(lang, "Wait for room"), Input::Checkbox)
                .help(help("queue")),
            Field::new("reservation", &i18n::word(lang, "Reservation"), Input::Text)
                .help(help("reservation")),
            share_field(lang),
            Field::new("ssh_key", "SSH", Input::TextArea)
                .answers(&["ssh_keys"])
                .help(help("ssh_key")),
        ],
    }
}

/// The `share` field of the VM and cluster forms: one project share to
/// mount, `NAME[:/PATH][:ro]` as the CLI's `--share`.
pub fn share_field(lang: Lang) -> listing::Field {
    listing::Field::new("share", t(lang, Msg::Share), listing::Input::Text)
        .placeholder("NAME[:/PATH][:ro]")
        .answers(&["shares"])
        .help(i18n::help(lang, "share"))
}

/// A tenant's VMs, their actions and the create form.
pub fn vms_page(
    lang: Lang,
    viewer: &Viewer,
    tenant: &str,
    vms: &[VmRow],
    choices: &VmChoices,
    refusal: Option<&listing::Refusal>,
) -> String {
    let mut form = vm_form(lang, tenant, choices);
    let error = refusal.map(|r| {
        let unplaced = form.refused(lang, r);
        listing::error_summary(lang, &form, "vm", r, &unplaced)
    });
    let vms: Vec<VmRow> = vms
        .iter()
        .map(|v| VmRow {
            state_label: i18n::word(lang, &v.state),
            actions: v
                .actions
                .iter()
                .map(|(a, _)| (a.clone(), i18n::word(lang, a)))
                .collect(),
            ..v.clone()
        })
        .collect();
    let body = Vms {
        tenant,
        heading: t(lang, Msg::VmsTitle),
        error,
        vms: &vms,
        csrf: &viewer.csrf,
        l_name: t(lang, Msg::Name),
        l_state: t(lang, Msg::State),
        l_host: t(lang, Msg::Host),
        l_create: t(lang, Msg::Create),
        form: listing::form_html(&form, "vm", &viewer.csrf),
        l_no_vms: i18n::word(lang, "no-vms").replace("TENANT", tenant),
    }
    .render()
    .unwrap_or_else(|e| format!("template error: {e}"));
    page(
        lang,
        t(lang, Msg::VmsTitle),
        Some(viewer),
        Some(tenant),
        &body,
    )
}

/// What the VM page shows.
#[derive(Debug, Clone, PartialEq)]
pub struct VmDetail {
    pub tenant: String,
    pub name: String,
    pub state: String,
    pub host: Option<String>,
    pub cells: Vec<diagram::Cell>,
    pub gpus: Vec<diagram::Gpu>,
    pub events: Vec<String>,
    pub nccl: Option<String>,
    /// Each NIC with its public ways in.
    pub networks: Vec<NicRow>,
    /// Its volumes: `(name, size, state, path in the guest)`.
    pub volumes: Vec<(String, String, String, String)>,
    /// The project shares it mounts.
    pub shares: Vec<ShareRow>,
    /// The actions its state allows (`start`, `stop`, …).
    pub actions: Vec<String>,
    /// Points charged to it this month so far, with the currency.
    pub cost_this_month: String,
    /// Its GPUs' figures over the last day (GPU VMs only).
    pub gpu_figures: Option<GpuFigures>,
    /// The idle policy's word on it, while its GPUs are idle.
    pub idle: Option<i18n::IdleNote>,
    /// How it boots, for a VM with devices passed through.
    pub boot: Option<Boot>,
    /// What is scheduled for it (its host's maintenance).
    pub scheduled: Vec<i18n::Scheduled>,
}

/// A UEFI guest's aperture and address width (`None`: BARs unknown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    pub aperture_gib: Option<u64>,
    pub phys_bits: Option<u8>,
}

/// A GPU VM's figures for its charts.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuFigures {
    pub utilisation: Vec<gpu_chart::Series>,
    /// GiB in use, with the GPUs' memory as the axis' top.
    pub memory: Vec<gpu_chart::Series>,
    pub memory_total_gib: f64,
    pub ticks: Vec<(i64, String)>,
    pub minutes: i64,
    pub step_minutes: i64,
    /// Whether the guest answers at all (else why charts are empty).
    pub guest_silent: bool,
}

/// A VM of the viewer's flagged idle on the dashboard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleFlag {
    pub tenant: String,
    pub vm: String,
    pub note: i18n::IdleNote,
}

/// One NIC on the VM page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicRow {
    pub segment: String,
    pub address: String,
    /// The floating address and forwarded ports, as text.
    pub public: String,
    /// The command that reaches the VM's SSH port from outside.
    pub ssh: Option<String>,
}

/// A project share in a VM, on the VM page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareRow {
    pub share: String,
    /// The guest's mount point.
    pub path: String,
    pub read_only: bool,
    /// The virtiofs tag (`mount -t virtiofs TAG PATH`).
    pub tag: String,
    /// How the mount stands (`mounted`, `at the next start`, why it
    /// failed); `None` before its host has said.
    pub condition: Option<String>,
}

#[derive(Template)]
#[template(path = "vm.html")]
struct VmPage<'a> {
    tenant: &'a str,
    name: &'a str,
    state: &'a str,
    state_label: &'a str,
    host: Option<&'a str>,
    svg: &'a str,
    events: &'a [String],
    nccl: Option<&'a str>,
    networks: &'a [NicRow],
    volumes: &'a [(String, String, String, String)],
    l_volumes: &'a str,
    /// `(share, path, read-only, tag, condition)` in the page's language.
    shares: Vec<(String, String, String, String, String)>,
    l_shares: &'a str,
    charts: Option<String>,
    l_gpu_figures: &'a str,
    idle: Option<String>,
    scheduled: Vec<String>,
    boot: Option<String>,
    l_state: &'a str,
    l_host: &'a str,
    l_topology: &'a str,
    l_events: &'a str,
    l_console: &'a str,
    csrf: &'a str,
    actions: Vec<(String, String)>,
    w_actions: String,
    w_reach: String,
    w_segment: String,
    w_address: String,
    w_public: String,
    w_volume: String,
    w_size: String,
    w_state: String,
    w_guest: String,
    w_share: String,
    w_path: String,
    w_read_only: String,
    w_tag: String,
    w_condition: String,
    w_cost: String,
    cost: &'a str,
    /// Why there is no way in yet, and what to do.
    reach_hint: Option<String>,
}

/// A GPU VM's two charts (and why they are empty, when the guest is
/// silent).
fn gpu_charts(lang: Lang, f: &GpuFigures) -> String {
    let empty = if f.guest_silent {
        t(lang, Msg::GuestSilent)
    } else {
        t(lang, Msg::NoGpuFigures)
    };
    let chart = |title, unit, max, series: &[gpu_chart::Series]| {
        gpu_chart::line_chart(
            &gpu_chart::Chart {
                title,
                unit,
                max,
                minutes: f.minutes,
                ticks: &f.ticks,
                step_minutes: f.step_minutes,
                empty,
            },
            series,
        )
    };
    let mut out = chart(t(lang, Msg::GpuUtil), "%", 100.0, &f.utilisation);
    out.push_str(&chart(
        t(lang, Msg::GpuMemory),
        "GiB",
        f.memory_total_gib,
        &f.memory,
    ));
    out
}

/// A VM: state, topology diagram, events and NCCL file.
pub fn vm_page(lang: Lang, viewer: &Viewer, vm: &VmDetail) -> String {
    let svg = diagram::topology_svg(&vm.cells, &vm.gpus);
    let state_label = i18n::word(lang, &vm.state);
    let body = VmPage {
        tenant: &vm.tenant,
        name: &vm.name,
        state: &vm.state,
        state_label: &state_label,
        host: vm.host.as_deref(),
        svg: &svg,
        events: &vm.events,
        nccl: vm.nccl.as_deref(),
        networks: &vm.networks,
        volumes: &vm.volumes,
        l_volumes: t(lang, Msg::Volumes),
        shares: vm
            .shares
            .iter()
            .map(|m| {
                (
                    m.share.clone(),
                    m.path.clone(),
                    i18n::word(lang, if m.read_only { "yes" } else { "no" }),
                    m.tag.clone(),
                    m.condition
                        .as_deref()
                        .map_or_else(|| "-".to_owned(), |c| i18n::mount_condition(lang, c)),
                )
            })
            .collect(),
        l_shares: t(lang, Msg::Shares),
        charts: vm.gpu_figures.as_ref().map(|f| gpu_charts(lang, f)),
        l_gpu_figures: t(lang, Msg::GpuFigures),
        idle: vm.idle.as_ref().map(|n| i18n::idle_sentence(lang, n)),
        scheduled: vm
            .scheduled
            .iter()
            .map(|e| i18n::scheduled_sentence(lang, e))
            .collect(),
        boot: vm.boot.as_ref().map(|b| i18n::boot_sentence(lang, b)),
        l_state: t(lang, Msg::State),
        l_host: t(lang, Msg::Host),
        l_topology: t(lang, Msg::Topology),
        l_events: t(lang, Msg::Events),
        l_console: t(lang, Msg::Console),
        csrf: &viewer.csrf,
        actions: vm
            .actions
            .iter()
            .map(|a| (a.clone(), i18n::word(lang, a)))
            .collect(),
        w_actions: i18n::word(lang, "Actions"),
        w_reach: i18n::word(lang, "How to reach it"),
        w_segment: i18n::word(lang, "Segment"),
        w_address: i18n::word(lang, "Address"),
        w_public: i18n::word(lang, "Public address"),
        w_volume: i18n::word(lang, "Volume"),
        w_size: i18n::word(lang, "Size"),
        w_state: i18n::word(lang, "State"),
        w_guest: i18n::word(lang, "In the guest"),
        w_share: i18n::word(lang, "Share"),
        w_path: i18n::word(lang, "Path in the guest"),
        w_read_only: i18n::word(lang, "Read-only"),
        w_tag: i18n::word(lang, "Tag"),
        w_condition: i18n::word(lang, "Condition"),
        w_cost: i18n::word(lang, "This month"),
        cost: &vm.cost_this_month,
        reach_hint: reach_hint(lang, &vm.networks),
    }
    .render()
    .unwrap_or_else(|e| format!("template error: {e}"));
    page(lang, &vm.name, Some(viewer), Some(&vm.tenant), &body)
}

/// What the VM page says when the VM cannot be reached from outside yet.
fn reach_hint(lang: Lang, networks: &[NicRow]) -> Option<String> {
    let key = if networks.is_empty() {
        "no-network"
    } else if networks.iter().all(|n| n.ssh.is_none()) {
        "no-public"
    } else {
        return None;
    };
    Some(i18n::word(lang, key))
}

#[derive(Template)]
#[template(path = "console.html")]
struct ConsolePage<'a> {
    tenant: &'a str,
    name: &'a str,
    csrf: &'a str,
    running: bool,
    has_terminal: bool,
    l_console: &'a str,
    l_help: &'a str,
    l_no_terminal: &'a str,
    l_send_text: &'a str,
    l_send_text_help: &'a str,
    l_press_enter: &'a str,
    l_send: &'a str,
    l_power: &'a str,
    l_power_help: &'a str,
    l_reboot: String,
    l_take_over: &'a str,
    l_reconnect: &'a str,
    l_connecting: &'a str,
    l_writing: &'a str,
    l_reading: &'a str,
    l_taken_over: &'a str,
    l_read_only: &'a str,
    l_took_over: &'a str,
    l_closed: &'a str,
    l_not_running: &'a str,
}

/// A VM's serial console: the terminal (xterm.js, when the build has it),
/// a box to send text, Ctrl-Alt-Del and reboot. `running`: whether the VM
/// has a console now.
pub fn console_page(lang: Lang, viewer: &Viewer, tenant: &str, vm: &str, running: bool) -> String {
    let body = ConsolePage {
        tenant,
        name: vm,
        csrf: &viewer.csrf,
        running,
        has_terminal: !XTERM_JS.is_empty(),
        l_console: t(lang, Msg::Console),
        l_help: t(lang, Msg::ConsoleHelp),
        l_no_terminal: t(lang, Msg::ConsoleNoTerminal),
        l_send_text: t(lang, Msg::SendText),
        l_send_text_help: t(lang, Msg::SendTextHelp),
        l_press_enter: t(lang, Msg::PressEnter),
        l_send: t(lang, Msg::Send),
        l_power: t(lang, Msg::Power),
        l_power_help: t(lang, Msg::PowerHelp),
        l_reboot: i18n::word(lang, "reboot"),
        l_take_over: t(lang, Msg::TakeOver),
        l_reconnect: t(lang, Msg::Reconnect),
        l_connecting: t(lang, Msg::ConsoleConnecting),
        l_writing: t(lang, Msg::ConsoleWriting),
        l_reading: t(lang, Msg::ConsoleReading),
        l_taken_over: t(lang, Msg::ConsoleTakenOver),
        l_read_only: t(lang, Msg::ConsoleReadOnly),
        l_took_over: t(lang, Msg::ConsoleTookOver),
        l_closed: t(lang, Msg::ConsoleClosed),
        l_not_running: t(lang, Msg::ConsoleNotRunning),
    }
    .render()
    .unwrap_or_else(|e| format!("template error: {e}"));
    let title = format!("{vm} — {}", t(lang, Msg::Console));
    page(lang, &title, Some(viewer), Some(tenant), &body)
}

/// What the billing page shows.
#[derive(Debug, Clone, PartialEq)]
pub struct BillingView {
    pub tenant: String,
    pub balance: String,
    pub currency: String,
    /// Points per UTC day, oldest first.
    pub daily: Vec<(String, f64)>,
    /// `YYYY-MM`, newest first.
    pub months: Vec<String>,
    /// `(from, vm, resource, seconds, amount)`, newest first.
    pub ledger: Vec<(String, String, String, i64, String)>,
}

#[derive(Template)]
#[template(path = "billing.html")]
struct Billing<'a> {
    tenant: &'a str,
    heading: &'a str,
    balance: &'a str,
    currency: &'a str,
    chart: &'a str,
    months: &'a [String],
    ledger: &'a [(String, String, String, i64, String)],
    l_balance: &'a str,
    l_usage: &'a str,
    l_statements: &'a str,
    l_ledger: &'a str,
    /// The ledger's headings: when, VM, resource, duration, points.
    heads: [String; 5],
    /// What to do when there are no points.
    no_points: Option<String>,
}

/// Points charged per day over 30 days, with its axis, unit and empty state.
fn usage_chart(lang: Lang, currency: &str, daily: &[(String, f64)]) -> String {
    let unit = format!("{} ({currency})", i18n::word(lang, "Points"));
    diagram::bar_chart(
        daily,
        &diagram::BarWords {
            unit: &unit,
            title: t(lang, Msg::Usage30),
            empty: &i18n::word(lang, "no-usage"),
        },
    )
}

/// Points, usage over the last 30 days as a chart, statements, ledger.
pub fn billing_page(lang: Lang, viewer: &Viewer, b: &BillingView) -> String {
    let chart = usage_chart(lang, &b.currency, &b.daily);
    let body = Billing {
        tenant: &b.tenant,
        heading: t(lang, Msg::Billing),
        balance: &b.balance,
        currency: &b.currency,
        chart: &chart,
        months: &b.months,
        ledger: &b.ledger,
        l_balance: t(lang, Msg::Points),
        l_usage: t(lang, Msg::Usage30),
        l_statements: t(lang, Msg::Statements),
        l_ledger: t(lang, Msg::Ledger),
        heads: ["When", "VM", "Resource", "Duration", "Points"].map(|w| i18n::word(lang, w)),
        no_points: b
            .balance
            .parse::<f64>()
            .is_ok_and(|v| v <= 0.0)
            .then(|| i18n::word(lang, "no-points")),
    }
    .render()
    .unwrap_or_else(|e| format!("template error: {e}"));
    page(
        lang,
        t(lang, Msg::Billing),
        Some(viewer),
        Some(&b.tenant),
        &body,
    )
}

/// A page of tables and forms over one kind of resource.
pub fn listing_page(
    lang: Lang,
    viewer: &Viewer,
    tenant: Option<&str>,
    l: &listing::Listing,
) -> String {
    let body = listing::render(l, &viewer.csrf);
    page(lang, &l.heading, Some(viewer), tenant, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn viewer(name: &str) -> Viewer {
        Viewer {
            display_name: name.into(),
            csrf: "tok".into(),
            is_admin: false,
        }
    }

    fn card(name: &str) -> TenantCard {
        TenantCard {
            name: name.into(),
            display_name: "<b>Vision</b> & Lab".into(),
            role: "owner".into(),
            vms: 3,
            gpus_used: 8,
            gpus_quota: 16,
            balance: Some("1000".into()),
        }
    }

    #[test]
    fn pages_speak_both_languages_and_escape_data() {
        let v = viewer("Aiko <script>");
        let en = dashboard_page(
            Lang::En,
            &v,
            &[card("vision")],
            "JPY",
            &[("11-01".into(), 3.0)],
            &[IdleFlag {
                tenant: "vision".into(),
                vm: "train".into(),
                note: i18n::IdleNote {
                    minutes: 750,
                    action: "shelve".into(),
                    action_at: Some("2026-11-26 09:00 UTC".into()),
                    exempt_until: None,
                },
            }],
        );
        assert!(
            en.contains("href=\"/t/vision/vms/train\"")
                && en.contains("idle for 12 h 30 min: it will be shelved at 2026-11-26 09:00 UTC"),
            "the idle flag: {en}"
        );
        assert!(en.contains("class=\"bar\""), "the usage chart");
        assert!(en.contains("<html lang=\"en\">") && en.contains("My projects"));
        assert!(
            en.contains("&#60;b&#62;Vision&#60;/b&#62; &#38; Lab"),
            "escaped"
        );
        assert!(!en.contains("Aiko <script>"));
        assert!(en.contains("8 / 16") && en.contains("1000 JPY"));
        assert!(
            en.contains("name=\"csrf\" value=\"tok\""),
            "logout carries the CSRF token"
        );
        let ja = dashboard_page(Lang::Ja, &v, &[], "JPY", &[], &[]);
        assert!(
            ja.contains("アイドル状態の GPU VM はありません"),
            "the empty state"
        );
        assert!(ja.contains("<html lang=\"ja\">") && ja.contains("参加プロジェクト"));
        assert!(ja.contains("まだどのプロジェクトにも参加していません"));
        assert!(ja.contains("href=\"/lang/en\""), "the switch");
    }

    #[test]
    fn the_vm_page_shows_the_ways_in() {
        let v = viewer("Aiko");
        let vm = VmDetail {
            tenant: "vision".into(),
            name: "train".into(),
            state: "running".into(),
            host: None,
            cells: vec![],
            gpus: vec![],
            events: vec![],
            nccl: None,
            networks: vec![NicRow {
                segment: "lan".into(),
                address: "10.1.0.2".into(),
                public: "203.0.113.11".into(),
                ssh: Some("ssh 203.0.113.11".into()),
            }],
            volumes: vec![(
                "data".into(),
                "50 GiB".into(),
                "attached".into(),
                "/dev/disk/by-id/virtio-kumo0123456789abcdef".into(),
            )],
            shares: vec![ShareRow {
                share: "datasets".into(),
                path: "/data".into(),
                read_only: true,
                tag: "datasets".into(),
                condition: Some("mounted read-only".into()),
            }],
            gpu_figures: Some(GpuFigures {
                utilisation: vec![gpu_chart::Series {
                    label: "0000:18:00.0".into(),
                    points: vec![(0, Some(90.0)), (10, Some(80.0))],
                }],
                memory: vec![gpu_chart::Series {
                    label: "0000:18:00.0".into(),
                    points: vec![(0, Some(40.0)), (10, Some(41.0))],
                }],
                memory_total_gib: 80.0,
                ticks: vec![(0, "09:00".into())],
                minutes: 1440,
                step_minutes: 10,
                guest_silent: false,
            }),
            idle: Some(i18n::IdleNote {
                minutes: 61,
                action: "notice".into(),
                action_at: None,
                exempt_until: Some("2026-12-01 00:00 UTC".into()),
            }),
            actions: vec!["stop".into(), "reboot".into(), "delete".into()],
            cost_this_month: "1234.5 JPY".into(),
            boot: Some(Boot {
                aperture_gib: Some(1025),
                phys_bits: Some(42),
            }),
            scheduled: vec![i18n::Scheduled {
                host: "gpu-7".into(),
                at: "2026-12-01 09:00 UTC".into(),
                action: "evacuate".into(),
                reason: Some("BMC firmware".into()),
            }],
        };
        let page = vm_page(Lang::Ja, &v, &vm);
        assert!(
            page.contains(
                "ホスト gpu-7 は 2026-12-01 09:00 UTC にメンテナンス予定です（BMC firmware）"
            ) && page.contains("kumo vm evacuate"),
            "{page}"
        );
        assert!(
            page.contains("64 ビット MMIO 領域は 1025 GiB、ゲストのアドレス幅は 42 ビット"),
            "{page}"
        );
        assert!(
            page.contains("接続方法") && page.contains("<th>公開アドレス</th>"),
            "{page}"
        );
        // Only what its state allows.
        assert!(
            page.contains(r#"data-action="stop">停止する</button>"#),
            "{page}"
        );
        assert!(!page.contains(r#"data-action="start""#), "{page}");
        assert!(
            page.contains("今月の利用額: <strong class=\"cost\">1234.5 JPY</strong>"),
            "{page}"
        );
        assert!(
            page.contains("<td>10.1.0.2</td><td>203.0.113.11</td>"),
            "{page}"
        );
        assert!(page.contains("<code>ssh 203.0.113.11</code>"), "{page}");
        assert!(
            page.contains("ボリューム")
                && page.contains("<code>/dev/disk/by-id/virtio-kumo0123456789abcdef</code>"),
            "{page}"
        );
        assert!(
            page.contains("<h2>共有ストレージ</h2>")
                && page.contains("<td>datasets</td><td><code>/data</code></td><td>はい</td><td><code>datasets</code></td><td>マウント済み（読み取り専用）</td>"),
            "{page}"
        );
        assert!(
            page.contains("GPU の過去 24 時間") && page.contains("使用率 (%)"),
            "{page}"
        );
        assert!(
            page.contains("使用メモリ (GiB)") && page.contains(">80 GiB</text>"),
            "{page}"
        );
        assert!(
            page.contains("2026-12-01 00:00 UTC までアイドルポリシーの対象外"),
            "{page}"
        );
        let none = vm_page(
            Lang::En,
            &v,
            &VmDetail {
                networks: vec![],
                volumes: vec![],
                shares: vec![],
                gpu_figures: None,
                idle: None,
                boot: None,
                scheduled: Vec::new(),
                ..vm
            },
        );
        assert!(!none.contains("Networks") && !none.contains("GPUs over"));
        assert!(!none.contains("class=\"boot\""), "{none}");
        assert!(none.contains("only its console reaches it"), "{none}");
        assert!(!none.contains("<h2>Volumes</h2>") && !none.contains("<h2>Shares</h2>"));
    }

    #[test]
    fn the_vm_form_starts_on_the_projects_default_segment() {
        let v = viewer("Aiko");
        let mut choices = VmChoices {
            segments: vec!["default".into(), "lab".into()],
            default_segment: Some("default".into()),
            ..VmChoices::default()
        };
        let page = vms_page(Lang::En, &v, "vision", &[], &choices, None);
        assert!(
            page.contains(r#"<option value="default" selected>"#),
            "{page}"
        );
        assert!(!page.contains(r#"<option value="lab" selected>"#), "{page}");
        choices.default_segment = None;
        let page = vms_page(Lang::En, &v, "vision", &[], &choices, None);
        assert!(page.contains(r#"<option value="" selected>"#), "{page}");
        assert!(
            !page.contains(r#"<option value="default" selected>"#),
            "{page}"
        );
    }

    #[test]
    fn the_vm_form_takes_a_share_and_the_project_links_its_shares() {
        let v = viewer("Aiko");
        let en = vms_page(Lang::En, &v, "vision", &[], &VmChoices::default(), None);
        assert!(
            en.contains(r#"name="share""#) && en.contains(r#"placeholder="NAME[:/PATH][:ro]""#),
            "{en}"
        );
        assert!(
            en.contains("A project share to mount: NAME[:/PATH][:ro]"),
            "{en}"
        );
        assert!(en.contains(r#"href="/t/vision/shares""#), "{en}");
        let ja = vms_page(Lang::Ja, &v, "vision", &[], &VmChoices::default(), None);
        assert!(
            ja.contains("マウントする共有ストレージ：NAME[:/PATH][:ro]")
                && ja.contains(">共有ストレージ<"),
            "{ja}"
        );
    }

    #[test]
    fn the_billing_page_heads_every_column_and_says_what_to_do_without_points() {
        let v = viewer("Aiko");
        let b = BillingView {
            tenant: "lab".into(),
            balance: "0".into(),
            currency: "JPY".into(),
            daily: vec![("11-24".into(), 0.0), ("11-25".into(), 0.0)],
            months: vec!["2026-11".into()],
            ledger: vec![(
                "2026-11-25 10:00".into(),
                "train".into(),
                "vcpu".into(),
                60,
                "0.5".into(),
            )],
        };
        let en = billing_page(Lang::En, &v, &b);
        assert!(
            en.contains(
                "<th>When</th><th>VM</th><th>Resource</th><th>Duration</th><th>Points</th>"
            ),
            "{en}"
        );
        assert!(
            en.contains("No points: ask a platform administrator"),
            "{en}"
        );
        assert!(
            en.contains("Nothing charged in these 30 days") && en.contains(">Points (JPY)</text>"),
            "{en}"
        );
        let ja = billing_page(
            Lang::Ja,
            &v,
            &BillingView {
                balance: "120.5".into(),
                daily: vec![("11-25".into(), 3.0)],
                ..b
            },
        );
        assert!(
            ja.contains("<th>日時</th>") && ja.contains(">ポイント (JPY)</text>"),
            "{ja}"
        );
        assert!(
            !ja.contains("ポイントがありません") && !ja.contains("課金はありません"),
            "{ja}"
        );
    }

    #[test]
    fn the_chooser_lists_institutions_and_keeps_next() {
        let ps = [ProviderItem {
            name: "uni-a".into(),
            display_name: "University A".into(),
        }];
        let html = login_page(Lang::En, &ps, "/vms?x=1", "tok");
        assert!(
            html.contains("href=\"/auth/login/uni-a?next=%2Fvms%3Fx%3D1\""),
            "{html}"
        );
        assert!(html.contains("University A") && html.contains("type=\"search\""));
        assert!(
            html.contains(r#"name="csrf" value="tok""#),
            "the token form's CSRF field"
        );
        let none = login_page(Lang::Ja, &[], "/", "tok");
        assert!(none.contains("機関が設定されていません"));
    }
}
