//! The web portal's pages (rendered by `kumo-web-portal`), mounted at `/`:
//! the institution chooser, the dashboard, the language switch, VMs and
//! points; [`resources`] has the listing pages, [`devices`] the admins'
//! fleet-health page. A page shows only what the session's user may see
//! through the API: tenants they are a member of.

mod devices;
mod resources;

use axum::extract::{Path, Query, State};
use axum::http::header::{ACCEPT_LANGUAGE, CONTENT_TYPE, LOCATION, REFERER, SET_COOKIE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use chrono::{Datelike, DurationRound};
use kumo_api_types::{Power, VmState};
use kumo_web_portal::i18n::Lang;
use kumo_web_portal::{diagram, ProviderItem, TenantCard, Viewer, VmRow};
use serde::Deserialize;

use crate::context::{Actor, AppState, Origin};
use crate::error::ApiError;
use crate::http::sso::{check_csrf, cookie, safe_next, session_of};

const LANG_COOKIE: &str = "kumo_lang";

fn lang(headers: &HeaderMap) -> Lang {
    Lang::pick(
        cookie(headers, LANG_COOKIE).as_deref(),
        headers.get(ACCEPT_LANGUAGE).and_then(|v| v.to_str().ok()),
    )
}

fn html(body: String) -> Response {
    ([(CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

#[derive(Deserialize)]
struct NextParam {
    next: Option<String>,
}

async fn login(
    State(st): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<NextParam>,
) -> Response {
    let providers: Vec<ProviderItem> = st
        .config
        .auth
        .oidc
        .iter()
        .map(|p| ProviderItem {
            name: p.name.clone(),
            display_name: p.display_name.clone(),
        })
        .collect();
    // The token form's CSRF token, double-submitted: the same value in a
    // cookie this site alone can set and in the form.
    let csrf = crate::http::sso::cookie(&headers, crate::http::sso::LOGIN_CSRF_COOKIE)
        .filter(|c| c.len() == 43)
        .unwrap_or_else(crate::http::sso::random_token);
    let mut r = html(kumo_web_portal::login_page(
        lang(&headers),
        &providers,
        &safe_next(q.next.as_deref()),
        &csrf,
    ));
    if let Ok(v) = format!(
        "{}={csrf}; Path=/auth/token; HttpOnly; SameSite=Strict; Max-Age=3600",
        crate::http::sso::LOGIN_CSRF_COOKIE
    )
    .parse()
    {
        r.headers_mut().insert(SET_COOKIE, v);
    }
    r
}

async fn dashboard(
    State(st): State<AppState>,
    headers: HeaderMap,
    origin: Origin,
) -> Result<Response, ApiError> {
    let Some((session, user)) = session_of(&st, &headers).await? else {
        return Ok((StatusCode::SEE_OTHER, [(LOCATION, "/login?next=/")]).into_response());
    };
    // Usage of all of them over the last 30 days.
    let from = thirty_days_from(st.config.clock.now());
    let board = crate::app::dashboard::dashboard(&st, &ctx_of(&user, origin), from).await?;
    let mut cards: Vec<TenantCard> = board
        .tenants
        .into_iter()
        .map(|t| TenantCard {
            name: t.name,
            display_name: t.display_name,
            role: t.role,
            vms: t.vms,
            gpus_used: t.gpus_used,
            gpus_quota: u64::try_from(t.gpus_quota).unwrap_or(0),
            balance: t.balance.map(|b| b.to_string()),
        })
        .collect();
    cards.sort_by(|a, b| a.name.cmp(&b.name));
    let per_day = board.charges.into_iter().map(|(at, amount)| {
        (
            at.format("%Y-%m-%d").to_string(),
            amount.to_string().parse().unwrap_or(0.0),
        )
    });
    let daily = thirty_days(from, per_day);
    let idle: Vec<_> = board
        .idle
        .iter()
        .map(|(tenant, policy, v)| kumo_web_portal::IdleFlag {
            tenant: tenant.clone(),
            vm: v.name.clone(),
            note: idle_note(policy, v),
        })
        .collect();
    let viewer = Viewer {
        display_name: user.display_name,
        csrf: session.csrf,
        is_admin: user.is_admin,
    };
    Ok(html(kumo_web_portal::dashboard_page(
        lang(&headers),
        &viewer,
        &cards,
        &st.config.billing.currency,
        &daily,
        &idle,
    )))
}

/// The language switch: remembered in a cookie, back to where one was.
async fn switch_lang(headers: HeaderMap, Path(code): Path<String>) -> Result<Response, ApiError> {
    let l = Lang::parse(&code).ok_or_else(|| ApiError::not_found(format!("language {code:?}")))?;
    let back = headers
        .get(REFERER)
        .and_then(|v| v.to_str().ok())
        .and_then(|r| r.find("://").map(|i| &r[i + 3..]))
        .and_then(|r| r.find('/').map(|i| r[i..].to_owned()));
    Ok((
        StatusCode::SEE_OTHER,
        [
            (LOCATION, safe_next(back.as_deref())),
            (
                SET_COOKIE,
                format!(
                    "{LANG_COOKIE}={}; Path=/; SameSite=Lax; Max-Age=31536000",
                    l.code()
                ),
            ),
        ],
    )
        .into_response())
}

#[derive(Deserialize)]
struct CliLogin {
    port: u16,
    state: String,
}

fn check_cli(port: u16, state: &str) -> Result<(), ApiError> {
    if port < 1024 {
        return Err(ApiError::field(
            "port",
            "the command's loopback port (1024 or above)",
        ));
    }
    if !(16..=128).contains(&state.len())
        || !state
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ApiError::field("state", "16 to 128 URL-safe characters"));
    }
    Ok(())
}

/// `kumo login`'s page: signed in, the user is asked to allow it.
async fn cli_login(
    State(st): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<CliLogin>,
) -> Result<Response, ApiError> {
    check_cli(q.port, &q.state)?;
    let here = format!("/login/cli?port={}&state={}", q.port, q.state);
    let (viewer, _) = match signed_in(&st, &headers, &here).await? {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    Ok(html(kumo_web_portal::cli_login_page(
        lang(&headers),
        &viewer,
        q.port,
        &q.state,
    )))
}

#[derive(Deserialize)]
struct CliAllow {
    csrf: String,
    port: u16,
    state: String,
}

/// Allowed: an API token for the user, handed to the command's loopback
/// port (and nowhere else) in a form's body, never in a URL.
async fn cli_allow(
    State(st): State<AppState>,
    headers: HeaderMap,
    origin: Origin,
    axum::Form(f): axum::Form<CliAllow>,
) -> Result<Response, ApiError> {
    check_cli(f.port, &f.state)?;
    let Some((session, user)) = session_of(&st, &headers).await? else {
        return Err(ApiError::Unauthenticated("sign in first".into()));
    };
    check_csrf(&session.csrf, &f.csrf)?;
    let minted = crate::app::tokens::mint_for(
        &st,
        &ctx_of(&user, origin),
        &user,
        kumo_api_types::TokenCreate {
            description: Some("kumo login".into()),
            expires_at: Some(chrono::Utc::now() + chrono::Duration::days(90)),
        },
    )
    .await?;
    let viewer = Viewer {
        display_name: user.display_name.clone(),
        csrf: session.csrf,
        is_admin: user.is_admin,
    };
    Ok(html(kumo_web_portal::cli_handoff_page(
        lang(&headers),
        &viewer,
        f.port,
        &f.state,
        &minted.token,
    )))
}

/// The API caller a session stands for: pages go through the same
/// handlers, so they see and may do exactly what the API allows.
/// The audit log records the browser's address and the request's id.
pub(crate) fn ctx_of(user: &crate::entity::users::Model, origin: Origin) -> Actor {
    Actor::new(
        crate::context::Caller {
            user: user.clone(),
            token_id: uuid::Uuid::nil(),
        },
        origin,
    )
}

/// What every listing page reads from its request: the headers (session
/// cookie, language) and where the browser is.
pub(crate) struct Browser {
    pub headers: HeaderMap,
    pub origin: Origin,
}

impl axum::extract::FromRequestParts<AppState> for Browser {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        st: &AppState,
    ) -> Result<Self, Self::Rejection> {
        Ok(Browser {
            headers: parts.headers.clone(),
            origin: Origin::from_request_parts(parts, st).await?,
        })
    }
}

/// The session, or a redirect to the chooser coming back to `here`.
async fn signed_in(
    st: &AppState,
    headers: &HeaderMap,
    here: &str,
) -> Result<Result<(Viewer, crate::entity::users::Model), Response>, ApiError> {
    match session_of(st, headers).await? {
        Some((s, u)) => Ok(Ok((
            Viewer {
                display_name: u.display_name.clone(),
                csrf: s.csrf,
                is_admin: u.is_admin,
            },
            u,
        ))),
        None => {
            let to = format!(
                "/login?next={}",
                openidconnect::url::form_urlencoded::byte_serialize(here.as_bytes())
                    .collect::<String>()
            );
            Ok(Err(
                (StatusCode::SEE_OTHER, [(LOCATION, to)]).into_response()
            ))
        }
    }
}

async fn vm_rows(st: &AppState, ctx: &Actor, tenant: &str) -> Result<Vec<VmRow>, ApiError> {
    let page = crate::app::vms::list(st, ctx, tenant, &first_page()).await?;
    Ok(page
        .items
        .into_iter()
        .map(|v| VmRow {
            actions: offered(&v)
                .into_iter()
                .map(|a| (a.to_owned(), String::new()))
                .collect(),
            name: v.name,
            state: v.state.as_str().to_owned(),
            state_label: String::new(),
            gpus: v.spec.gpus,
            host: v.host.unwrap_or_default(),
        })
        .collect())
}

/// The actions the portal offers for a VM: what its state allows.
fn offered(v: &kumo_api_types::Vm) -> Vec<&'static str> {
    // What it was last asked to be, as far as its state tells.
    let desired = match v.state {
        VmState::Stopped | VmState::Shelved | VmState::Shelving => Power::Stopped,
        _ => Power::Running,
    };
    crate::domain::lifecycle::offered(v.state, desired, v.host.is_some())
}

/// The first 200 of a list: what a page shows.
pub(super) fn first_page() -> kumo_api_types::PageParams {
    kumo_api_types::PageParams {
        limit: Some(200),
        page_token: None,
    }
}

/// The VM form's choices: priced GPU models, templates, the project's
/// segments — each as the API shows them to this user.
async fn vm_choices(
    st: &AppState,
    ctx: &Actor,
    tenant: &str,
) -> Result<kumo_web_portal::VmChoices, ApiError> {
    let rates = crate::app::billing::rates(st, ctx).await?;
    let gpu_models = rates
        .current
        .iter()
        .flat_map(|c| c.prices.keys())
        .filter_map(|class| class.strip_prefix("gpu:"))
        .map(str::to_owned)
        .collect();
    let templates = crate::app::templates::list(st, ctx, &first_page())
        .await?
        .items
        .into_iter()
        .map(|t| t.name)
        .collect();
    let segments: Vec<kumo_api_types::Segment> =
        crate::app::segments::list(st, ctx, tenant, &first_page())
            .await?
            .items;
    // The form starts on the project's default segment, as the CLI does.
    let default_segment = segments
        .iter()
        .find(|s| {
            s.name == kumo_api_types::DEFAULT_SEGMENT
                && s.kind == kumo_api_types::SegmentKind::Ethernet
        })
        .map(|s| s.name.clone());
    Ok(kumo_web_portal::VmChoices {
        gpu_models,
        templates,
        segments: segments.into_iter().map(|s| s.name).collect(),
        default_segment,
    })
}

async fn vms_page(
    State(st): State<AppState>,
    headers: HeaderMap,
    origin: Origin,
    Path(tenant): Path<String>,
) -> Result<Response, ApiError> {
    let (viewer, user) = match signed_in(&st, &headers, &format!("/t/{tenant}/vms")).await? {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let ctx = ctx_of(&user, origin);
    let rows = vm_rows(&st, &ctx, &tenant).await?;
    let choices = vm_choices(&st, &ctx, &tenant).await?;
    Ok(html(kumo_web_portal::vms_page(
        lang(&headers),
        &viewer,
        &tenant,
        &rows,
        &choices,
        None,
    )))
}

/// A posted form's fields by name.
pub(super) type Fields = std::collections::HashMap<String, String>;

/// A field's value, trimmed; empty (a select's "any") is none.
pub(super) fn text(f: &Fields, k: &str) -> Option<String> {
    f.get(k)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

pub(super) fn number<T: std::str::FromStr>(f: &Fields, k: &str) -> Result<Option<T>, ApiError> {
    text(f, k)
        .map(|v| v.parse().map_err(|_| ApiError::field(k, "a whole number")))
        .transpose()
}

/// A form's refusal as the page shows it: the API's message, its field
/// errors, and what was entered (so the form comes back filled in).
pub(super) fn refusal(e: &ApiError, submitted: &Fields) -> kumo_web_portal::listing::Refusal {
    let p = e.to_problem();
    let mut submitted = submitted.clone();
    submitted.remove("csrf");
    kumo_web_portal::listing::Refusal {
        message: p.detail.unwrap_or(p.title),
        fields: p.errors.into_iter().map(|f| (f.field, f.message)).collect(),
        submitted,
    }
}

/// The required fields a form left empty, all at once (the API would
/// name only the first).
pub(super) fn missing(form: &kumo_web_portal::listing::Form, f: &Fields) -> Result<(), ApiError> {
    let missing = form.missing(f);
    if missing.is_empty() {
        return Ok(());
    }
    Err(ApiError::fields(
        missing
            .into_iter()
            .map(|(field, message)| kumo_api_types::FieldError { field, message })
            .collect(),
    ))
}

/// The form's `share` field: `NAME[:/PATH][:ro]`, as the CLI's `--share`.
fn share_mounts(f: &Fields) -> Result<Vec<kumo_api_types::ShareMountRequest>, ApiError> {
    text(f, "share")
        .map(|s| {
            kumo_api_types::ShareMountRequest::parse(&s).map_err(|e| ApiError::field("share", e))
        })
        .into_iter()
        .collect()
}

/// The shares a form names are the project's: a name it lacks is the
/// field's error, not the API's 404 (which the portal keeps for a foreign
/// or missing project: the callers have read the project's page by now).
pub(super) async fn known_shares(
    st: &AppState,
    ctx: &Actor,
    tenant: &str,
    asked: &[kumo_api_types::ShareMountRequest],
) -> Result<(), ApiError> {
    for r in asked {
        match crate::app::shares::show(st, ctx, tenant, &r.share).await {
            Ok(_) => {}
            Err(ApiError::NotFound(_)) => {
                return Err(ApiError::field(
                    "share",
                    format!("no share {:?} in project {tenant:?}", r.share),
                ))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The VM the create form asks for.
fn vm_create(f: &Fields) -> Result<kumo_api_types::VmCreate, ApiError> {
    Ok(kumo_api_types::VmCreate {
        name: text(f, "name").unwrap_or_default(),
        gpus: number(f, "gpus")?.unwrap_or(0),
        gpu_model: text(f, "gpu_model"),
        vcpus: number(f, "vcpus")?,
        memory_gib: number(f, "memory_gib")?,
        disk_gib: None,
        template: text(f, "template"),
        service_level: if text(f, "spot").is_some() {
            kumo_api_types::ServiceLevel::Spot
        } else {
            kumo_api_types::ServiceLevel::Guaranteed
        },
        ssh_keys: text(f, "ssh_key").into_iter().collect(),
        networks: text(f, "network")
            .map(|segment| kumo_api_types::NetworkRequest { segment, ip: None })
            .into_iter()
            .collect(),
        volumes: Vec::new(),
        shares: share_mounts(f)?,
        on_reclaim: None,
        on_host_loss: None,
        notice_seconds: None,
        public_ip: text(f, "public_ip").is_some(),
        queue: text(f, "queue").is_some(),
        reservation: text(f, "reservation"),
    })
}

async fn create_vm(
    State(st): State<AppState>,
    headers: HeaderMap,
    origin: Origin,
    Path(tenant): Path<String>,
    axum::Form(f): axum::Form<Fields>,
) -> Result<Response, ApiError> {
    let (viewer, user) = match signed_in(&st, &headers, &format!("/t/{tenant}/vms")).await? {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    check_csrf(
        &viewer.csrf,
        f.get("csrf").map(String::as_str).unwrap_or(""),
    )?;
    let ctx = ctx_of(&user, origin);
    let lang = lang(&headers);
    // The choices are the tenant's: reading them first keeps a foreign
    // tenant a 404 before any field is judged; a refusal shows them again.
    let choices = vm_choices(&st, &ctx, &tenant).await?;
    let made = async {
        missing(&kumo_web_portal::vm_form(lang, &tenant, &choices), &f)?;
        let body = vm_create(&f)?;
        known_shares(&st, &ctx, &tenant, &body.shares).await?;
        crate::app::vms::create(&st, &ctx, &tenant, &body).await
    }
    .await;
    match made {
        Ok((_, vm)) => Ok((
            StatusCode::SEE_OTHER,
            [(LOCATION, format!("/t/{tenant}/vms/{}", vm.name))],
        )
            .into_response()),
        // A foreign or missing tenant stays a 404, whatever the form said.
        Err(e @ ApiError::NotFound(_)) => Err(e),
        Err(e) => {
            let rows = vm_rows(&st, &ctx, &tenant).await?;
            let mut r = html(kumo_web_portal::vms_page(
                lang,
                &viewer,
                &tenant,
                &rows,
                &choices,
                Some(&refusal(&e, &f)),
            ));
            *r.status_mut() = e.status();
            Ok(r)
        }
    }
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: String,
}

async fn vm_action(
    State(st): State<AppState>,
    headers: HeaderMap,
    origin: Origin,
    Path((tenant, vm, action)): Path<(String, String, String)>,
    axum::Form(f): axum::Form<CsrfForm>,
) -> Result<Response, ApiError> {
    let (viewer, user) = match signed_in(&st, &headers, &format!("/t/{tenant}/vms")).await? {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    check_csrf(&viewer.csrf, &f.csrf)?;
    let ctx = ctx_of(&user, origin);
    if action == "unshelve-anywhere" {
        crate::app::vms::unshelve(&st, &ctx, &tenant, &vm, true).await?;
    } else {
        let action = crate::domain::lifecycle::Action::parse(&action)
            .ok_or_else(|| ApiError::not_found(format!("action {action:?}")))?;
        crate::app::vms::act(&st, &ctx, &tenant, &vm, action).await?;
    }
    Ok((
        StatusCode::SEE_OTHER,
        [(LOCATION, format!("/t/{tenant}/vms"))],
    )
        .into_response())
}

/// A VM's console page (the terminal connects from its script).
async fn console_page(
    State(st): State<AppState>,
    headers: HeaderMap,
    origin: Origin,
    Path((tenant, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let here = format!("/t/{tenant}/vms/{name}/console");
    let (viewer, user) = match signed_in(&st, &headers, &here).await? {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let vm = crate::app::vms::show(&st, &ctx_of(&user, origin), &tenant, &name).await?;
    let running = matches!(
        vm.state,
        kumo_api_types::VmState::Running | kumo_api_types::VmState::Preempting
    );
    Ok(html(kumo_web_portal::console_page(
        lang(&headers),
        &viewer,
        &tenant,
        &vm.name,
        running,
    )))
}

#[derive(Deserialize)]
struct ConsoleForm {
    csrf: String,
    mode: Option<kumo_api_types::ConsoleMode>,
}

/// The console page's ticket: as the API's, with the portal session as
/// the credential (signing out closes the console).
async fn console_ticket(
    State(st): State<AppState>,
    headers: HeaderMap,
    origin: Origin,
    Path((tenant, name)): Path<(String, String)>,
    axum::Form(f): axum::Form<ConsoleForm>,
) -> Result<Response, ApiError> {
    let Some((session, user)) = session_of(&st, &headers).await? else {
        return Err(ApiError::Unauthenticated("sign in first".into()));
    };
    check_csrf(&session.csrf, &f.csrf)?;
    let t = crate::app::consoles::authorize(
        &st,
        &ctx_of(&user, origin),
        crate::consoles::Credential::Session(session.id),
        &tenant,
        &name,
        f.mode.unwrap_or_default(),
    )
    .await?;
    Ok((StatusCode::CREATED, axum::Json(t)).into_response())
}

/// The idle policy's word on a VM, for the pages.
fn idle_note(
    policy: &kumo_api_types::IdlePolicy,
    v: &kumo_api_types::IdleVm,
) -> kumo_web_portal::i18n::IdleNote {
    let when = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M UTC").to_string();
    kumo_web_portal::i18n::IdleNote {
        minutes: v.idle_minutes,
        action: policy.action.as_str().to_owned(),
        action_at: v.action_at.map(when),
        exempt_until: v.exempt_until.map(when),
    }
}

/// A GPU VM's last day, in 10-minute steps, for its charts.
async fn gpu_figures(
    st: &AppState,
    ctx: &crate::context::Actor,
    tenant: &str,
    vm: &str,
) -> Result<kumo_web_portal::GpuFigures, ApiError> {
    use kumo_web_portal::gpu_chart::Series;
    let step = 10;
    let q = kumo_api_types::MetricsQuery {
        step_minutes: Some(step),
        ..Default::default()
    };
    let m = crate::app::gpu_telemetry::metrics(st, ctx, tenant, vm, &q).await?;
    let at = |t: chrono::DateTime<chrono::Utc>| (t - m.from).num_minutes();
    let mut total: f64 = 0.0;
    let mut utilisation = Vec::new();
    let mut memory = Vec::new();
    for g in &m.gpus {
        utilisation.push(Series {
            label: g.host_bdf.clone(),
            points: g
                .points
                .iter()
                .map(|p| (at(p.at), p.utilization_pct))
                .collect(),
        });
        memory.push(Series {
            label: g.host_bdf.clone(),
            points: g
                .points
                .iter()
                .map(|p| (at(p.at), p.memory_used_mib.map(|m| m as f64 / 1024.0)))
                .collect(),
        });
        for p in &g.points {
            total = total.max(p.memory_total_mib.unwrap_or(0) as f64 / 1024.0);
        }
    }
    // A time label every 6 hours, on whole hours.
    let minutes = (m.to - m.from).num_minutes();
    let first = m
        .from
        .duration_trunc(chrono::Duration::hours(6))
        .unwrap_or(m.from)
        + chrono::Duration::hours(6);
    let ticks = (0..4)
        .map(|i| first + chrono::Duration::hours(6 * i))
        .filter(|t| *t < m.to)
        .map(|t| (at(t), t.format("%H:%M").to_string()))
        .collect();
    Ok(kumo_web_portal::GpuFigures {
        utilisation,
        memory,
        memory_total_gib: total.round(),
        ticks,
        minutes,
        step_minutes: i64::from(step),
        guest_silent: m.telemetry == "unknown",
    })
}

async fn vm_page(
    State(st): State<AppState>,
    headers: HeaderMap,
    origin: Origin,
    Path((tenant, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (viewer, user) = match signed_in(&st, &headers, &format!("/t/{tenant}/vms/{name}")).await? {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let ctx = ctx_of(&user, origin);
    let vm = crate::app::vms::show(&st, &ctx, &tenant, &name).await?;
    let events = crate::app::vms::events(
        &st,
        &ctx,
        &tenant,
        &kumo_api_types::PageParams {
            limit: Some(500),
            page_token: None,
        },
    )
    .await?
    .items
    .into_iter()
    .filter(|e| e.vm_id == vm.id)
    .map(|e| {
        format!(
            "{} {} — {}",
            e.at.format("%Y-%m-%d %H:%M:%S"),
            e.kind,
            e.message
        )
    })
    .collect();
    let nccl = if vm.placement.is_some() {
        crate::app::vms::nccl_topology(&st, &ctx, &tenant, &name)
            .await
            .ok()
    } else {
        None
    };
    let placement = vm.placement.clone().unwrap_or(kumo_api_types::VmPlacement {
        gpus: vec![],
        numa: vec![],
        firmware: "bios".into(),
        mmio64_bytes: None,
        phys_bits: None,
    });
    let host = match &vm.host {
        Some(h) => host_topology(&st, h).await?,
        None => None,
    };
    let gpu_figures = if vm.spec.gpus > 0 {
        Some(gpu_figures(&st, &ctx, &tenant, &name).await?)
    } else {
        None
    };
    let idle = if vm.spec.gpus > 0 {
        let r = crate::app::idle_gpus::report(&st, &ctx, &tenant).await?;
        r.vms
            .iter()
            .find(|v| {
                v.vm == vm.id
                    && v.idle_since.is_some()
                    && (v.notices > 0 || v.exempt_until.is_some() || v.idle_minutes >= 60)
            })
            .map(|v| idle_note(&r.policy, v))
    } else {
        None
    };
    let cost = crate::app::billing::vm_cost_this_month(&st, &ctx, &tenant, vm.id).await?;
    let detail = kumo_web_portal::VmDetail {
        cost_this_month: format!("{cost} {}", st.config.billing.currency),
        actions: offered(&vm).into_iter().map(str::to_owned).collect(),
        gpu_figures,
        idle,
        scheduled: vm
            .scheduled_events
            .iter()
            .map(|e| kumo_web_portal::i18n::Scheduled {
                host: e.host.clone(),
                at: e.at.format("%Y-%m-%d %H:%M UTC").to_string(),
                action: match e.action {
                    kumo_api_types::ScheduledAction::Evacuate => "evacuate",
                    kumo_api_types::ScheduledAction::Replace => "replace",
                    kumo_api_types::ScheduledAction::Stop => "stop",
                    kumo_api_types::ScheduledAction::Reclaimable => "reclaimable",
                }
                .into(),
                reason: e.reason.clone(),
            })
            .collect(),
        boot: (placement.firmware == "efi").then(|| kumo_web_portal::Boot {
            aperture_gib: placement.mmio64_bytes.map(|b| b.div_ceil(1 << 30)),
            phys_bits: placement.phys_bits,
        }),
        tenant: tenant.clone(),
        name: vm.name.clone(),
        state: vm.state.as_str().to_owned(),
        host: vm.host.clone(),
        cells: placement
            .numa
            .iter()
            .map(|n| diagram::Cell {
                guest_node: n.guest_node,
                host_node: n.host_node,
                vcpus: n.vcpus.clone(),
                memory_mib: n.memory_mib,
            })
            .collect(),
        gpus: placement
            .gpus
            .iter()
            .map(|g| diagram::Gpu {
                model: g.model.clone(),
                host_bdf: g.host_bdf.clone(),
                guest_bdf: g.guest_bdf.clone(),
                guest_node: g.guest_numa,
                nic: g.nic.as_ref().map(|n| diagram::Nic {
                    name: n.clone(),
                    host_bdf: g.nic_vf.clone().unwrap_or_else(|| n.clone()),
                    guest_bdf: g.nic_guest_bdf.clone(),
                }),
                switch: host.as_ref().and_then(|t| switch_above(t, &g.host_bdf)),
                nvlinks: host
                    .as_ref()
                    .and_then(|t| {
                        t.gpus
                            .iter()
                            .find(|x| x.location.bdf.to_string() == g.host_bdf)
                    })
                    .map(|x| x.nvlinks.iter().map(|l| l.count).sum())
                    .unwrap_or(0),
            })
            .collect(),
        events,
        nccl,
        networks: vm
            .networks
            .iter()
            .map(|n| kumo_web_portal::NicRow {
                segment: n.segment.clone(),
                address: n.ip.clone(),
                public: n
                    .public_ip
                    .iter()
                    .cloned()
                    .chain(n.forwards.iter().map(ToString::to_string))
                    .collect::<Vec<_>>()
                    .join(", "),
                ssh: n.ssh_command(None),
            })
            .collect(),
        volumes: crate::app::volumes::of_vm(&st, &ctx, &tenant, vm.id)
            .await?
            .into_iter()
            .map(|v| {
                let path = v.guest_path();
                (
                    v.name,
                    format!("{} GiB", v.size_gib),
                    kumo_web_portal::i18n::word(lang(&headers), v.state.as_str()),
                    path,
                )
            })
            .collect(),
        shares: vm
            .shares
            .iter()
            .map(|m| kumo_web_portal::ShareRow {
                share: m.share.clone(),
                path: m.path.clone(),
                read_only: m.read_only,
                tag: m.tag.clone(),
                condition: m.condition.clone(),
            })
            .collect(),
    };
    Ok(html(kumo_web_portal::vm_page(
        lang(&headers),
        &viewer,
        &detail,
    )))
}

/// The topology a host registered (the server's own record; `None` if it
/// cannot be read, and the diagram goes without switches and NVLink).
async fn host_topology(
    st: &AppState,
    name: &str,
) -> Result<Option<kumo_topology::HostTopology>, ApiError> {
    Ok(crate::store::hosts::find(&st.db, name)
        .await?
        .and_then(|h| serde_json::from_str(&h.topology).ok()))
}

/// The PCIe switch a GPU hangs under on its host (as guest layout groups
/// devices); `None` for a GPU straight on a root port.
fn switch_above(t: &kumo_topology::HostTopology, gpu_bdf: &str) -> Option<String> {
    let gpu = t
        .gpus
        .iter()
        .find(|g| g.location.bdf.to_string() == gpu_bdf)?;
    (gpu.location.pcie_path.len() >= 2)
        .then(|| kumo_topology::guest_layout::switch_group(&gpu.location))
}

/// The start (UTC midnight) of the 30 days up to `now`.
fn thirty_days_from(now: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    (now - chrono::Duration::days(29))
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .map(|t| t.and_utc())
        .unwrap_or(now)
}

/// Points per day for the 30 days from `from`, `MM-DD` labels, zero
/// where nothing was charged.
fn thirty_days(
    from: chrono::DateTime<chrono::Utc>,
    per_day: impl Iterator<Item = (String, f64)>,
) -> Vec<(String, f64)> {
    let mut by_day: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    for (day, v) in per_day {
        *by_day.entry(day).or_default() += v;
    }
    (0..30)
        .map(|i| {
            let day = (from + chrono::Duration::days(i))
                .format("%Y-%m-%d")
                .to_string();
            let v = by_day.get(&day).copied().unwrap_or(0.0);
            (day[5..].to_owned(), v)
        })
        .collect()
}

/// A tenant's points, the last 30 days as a chart, statements, ledger.
async fn billing_page(
    State(st): State<AppState>,
    headers: HeaderMap,
    origin: Origin,
    Path(tenant): Path<String>,
) -> Result<Response, ApiError> {
    let (viewer, user) = match signed_in(&st, &headers, &format!("/t/{tenant}/billing")).await? {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let ctx = ctx_of(&user, origin);
    let points = crate::app::billing::points(&st, &ctx, &tenant).await?;
    let now = st.config.clock.now();
    let from = thirty_days_from(now);
    let usage = crate::app::billing::usage(
        &st,
        &ctx,
        &tenant,
        &kumo_api_types::UsageParams {
            from: Some(from),
            to: Some(now + chrono::Duration::seconds(1)),
            group_by: kumo_api_types::UsageGroup::Day,
        },
    )
    .await?;
    let daily = thirty_days(
        from,
        usage
            .rows
            .iter()
            .map(|r| (r.key.clone(), r.amount.parse().unwrap_or(0.0))),
    );
    let this = now.format("%Y-%m").to_string();
    let last = (now.date_naive().with_day(1).unwrap_or(now.date_naive())
        - chrono::Duration::days(1))
    .format("%Y-%m")
    .to_string();
    let view = kumo_web_portal::BillingView {
        tenant: tenant.clone(),
        balance: points.balance,
        currency: points.currency,
        daily,
        months: vec![this, last],
        ledger: points
            .ledger
            .iter()
            .take(50)
            .map(|c| {
                (
                    c.from.format("%Y-%m-%d %H:%M").to_string(),
                    c.vm.clone(),
                    c.resource.clone(),
                    c.seconds,
                    c.amount.clone(),
                )
            })
            .collect(),
    };
    Ok(html(kumo_web_portal::billing_page(
        lang(&headers),
        &viewer,
        &view,
    )))
}

/// A month's statement as a CSV download.
async fn statement_csv(
    State(st): State<AppState>,
    headers: HeaderMap,
    origin: Origin,
    Path((tenant, file)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (_, user) = match signed_in(&st, &headers, &format!("/t/{tenant}/billing")).await? {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let month = file
        .strip_suffix(".csv")
        .ok_or_else(|| ApiError::not_found(format!("statement {file:?}")))?
        .to_owned();
    let statement =
        crate::app::billing::statement(&st, &ctx_of(&user, origin), &tenant, &month).await?;
    let mut r = (
        [(CONTENT_TYPE, "text/csv; charset=utf-8")],
        kumo_billing::statement::to_csv(&statement),
    )
        .into_response();
    if let Ok(v) = format!("attachment; filename=\"kumo-{tenant}-{month}.csv\"").parse() {
        r.headers_mut()
            .insert(axum::http::header::CONTENT_DISPOSITION, v);
    }
    Ok(r)
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(dashboard))
        .route("/t/{tenant}/billing", get(billing_page))
        .route("/t/{tenant}/billing/statements/{file}", get(statement_csv))
        .route("/t/{tenant}/vms", get(vms_page).post(create_vm))
        .route("/t/{tenant}/vms/live", get(vms_live))
        .route("/t/{tenant}/vms/{vm}", get(vm_page))
        .route(
            "/t/{tenant}/vms/{vm}/console",
            get(console_page).post(console_ticket),
        )
        .route(
            "/t/{tenant}/vms/{vm}/{action}",
            axum::routing::post(vm_action),
        )
        .route("/login/cli", get(cli_login).post(cli_allow))
        .route("/login", get(login))
        .route("/lang/{code}", get(switch_lang))
        .route("/static/portal.js", get(portal_js))
        .route("/static/console.js", get(console_js))
        .route("/static/xterm.js", get(xterm_js))
        .route("/static/xterm.css", get(xterm_css))
        .merge(devices::routes())
        .merge(resources::routes())
}

/// A static file of the portal's, cached a while.
fn asset(content_type: &'static str, body: &'static [u8]) -> Response {
    if body.is_empty() {
        return StatusCode::NOT_FOUND.into_response();
    }
    (
        [
            (CONTENT_TYPE, content_type),
            (axum::http::header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}

async fn portal_js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        kumo_web_portal::PORTAL_JS.as_bytes(),
    )
}

async fn console_js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        kumo_web_portal::CONSOLE_JS.as_bytes(),
    )
}

async fn xterm_js() -> Response {
    asset("text/javascript; charset=utf-8", kumo_web_portal::XTERM_JS)
}

async fn xterm_css() -> Response {
    asset("text/css; charset=utf-8", kumo_web_portal::XTERM_CSS)
}

#[derive(serde::Serialize)]
struct LiveVm {
    name: String,
    state: String,
    label: String,
}

/// The feed of the pages' live states: a tenant's VMs and their states in
/// the page's language, for the session's user (401 without one).
async fn vms_live(
    State(st): State<AppState>,
    headers: HeaderMap,
    origin: Origin,
    Path(tenant): Path<String>,
) -> Result<Response, ApiError> {
    let Some((_, user)) = session_of(&st, &headers).await? else {
        return Err(ApiError::Unauthenticated("sign in first".into()));
    };
    let l = lang(&headers);
    let rows = vm_rows(&st, &ctx_of(&user, origin), &tenant).await?;
    Ok(axum::Json(
        rows.into_iter()
            .map(|v| LiveVm {
                label: kumo_web_portal::i18n::word(l, &v.state),
                name: v.name,
                state: v.state,
            })
            .collect::<Vec<_>>(),
    )
    .into_response())
}

#[cfg(test)]
mod vm_form_tests {
    use super::*;

    /// The form's "Public address" checkbox asks for `public_ip`; left
    /// unticked (absent from the form), it does not.
    #[test]
    fn the_public_address_checkbox_asks_for_one() {
        let mut f: Fields = [("name", "web"), ("network", "lan")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert!(!vm_create(&f).unwrap().public_ip);
        f.insert("public_ip".into(), "on".into());
        let v = vm_create(&f).unwrap();
        assert!(v.public_ip);
        assert_eq!(v.networks[0].segment, "lan");
    }
}
