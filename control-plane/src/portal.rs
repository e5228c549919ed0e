//! The web portal's pages (rendered by `kumo-web-portal`), mounted at `/`:
//! the institution chooser, the dashboard, the language switch. A page
//! shows only what the session's user may see through the API: tenants
//! they are a member of.

use axum::extract::{Path, Query, State};
use axum::http::header::{ACCEPT_LANGUAGE, CONTENT_TYPE, COOKIE, LOCATION, REFERER, SET_COOKIE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use kumo_web_portal::i18n::Lang;
use kumo_web_portal::{ProviderItem, TenantCard, Viewer};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde::Deserialize;

use crate::api::vms::stored_spec;
use crate::entity::{memberships, tenant_gpu_quotas, tenants, vms};
use crate::error::ApiError;
use crate::extract::Ctx;
use crate::server::AppState;
use crate::sso::{safe_next, session_of};

const LANG_COOKIE: &str = "kumo_lang";

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

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
    html(kumo_web_portal::login_page(
        lang(&headers),
        &providers,
        &safe_next(q.next.as_deref()),
    ))
}

async fn dashboard(State(st): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let Some((session, user)) = session_of(&st, &headers).await? else {
        return Ok((StatusCode::SEE_OTHER, [(LOCATION, "/login?next=/")]).into_response());
    };
    let mut cards = Vec::new();
    for m in memberships::Entity::find()
        .filter(memberships::Column::UserId.eq(user.id))
        .all(&st.db)
        .await?
    {
        let Some(t) = tenants::Entity::find_by_id(m.tenant_id).one(&st.db).await? else {
            continue;
        };
        let rows = vms::Entity::find()
            .filter(vms::Column::TenantId.eq(t.id))
            .all(&st.db)
            .await?;
        let mut gpus_used = 0u64;
        for v in rows.iter().filter(|v| v.host_id.is_some()) {
            gpus_used += u64::from(stored_spec(v)?.gpus);
        }
        let gpus_quota: i64 = tenant_gpu_quotas::Entity::find()
            .filter(tenant_gpu_quotas::Column::TenantId.eq(t.id))
            .all(&st.db)
            .await?
            .iter()
            .map(|q| q.gpus)
            .sum();
        let (grants, charged) = crate::api::billing::ledger_of(&st.db, &t).await?;
        let balance = if grants.is_empty() {
            None
        } else {
            Some(
                crate::api::billing::balance_of(&grants, &charged, st.config.clock.now())?
                    .balance
                    .to_string(),
            )
        };
        cards.push(TenantCard {
            name: t.name.clone(),
            display_name: t.display_name.clone(),
            role: m.role.clone(),
            vms: rows.len() as u64,
            gpus_used,
            gpus_quota: u64::try_from(gpus_quota).unwrap_or(0),
            balance,
        });
    }
    cards.sort_by(|a, b| a.name.cmp(&b.name));
    let viewer = Viewer {
        display_name: user.display_name,
        csrf: session.csrf,
    };
    Ok(html(kumo_web_portal::dashboard_page(
        lang(&headers),
        &viewer,
        &cards,
        &st.config.billing.currency,
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
    let Some((session, user)) = session_of(&st, &headers).await? else {
        let back = format!("/login/cli?port={}&state={}", q.port, q.state);
        let to = format!(
            "/login?next={}",
            openidconnect::url::form_urlencoded::byte_serialize(back.as_bytes())
                .collect::<String>()
        );
        return Ok((StatusCode::SEE_OTHER, [(LOCATION, to)]).into_response());
    };
    Ok(html(kumo_web_portal::cli_login_page(
        lang(&headers),
        &Viewer {
            display_name: user.display_name,
            csrf: session.csrf,
        },
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
/// port (and nowhere else).
async fn cli_allow(
    State(st): State<AppState>,
    headers: HeaderMap,
    axum::Form(f): axum::Form<CliAllow>,
) -> Result<Response, ApiError> {
    check_cli(f.port, &f.state)?;
    let Some((session, user)) = session_of(&st, &headers).await? else {
        return Err(ApiError::Unauthenticated("sign in first".into()));
    };
    if !bool::from(subtle::ConstantTimeEq::ct_eq(
        session.csrf.as_bytes(),
        f.csrf.as_bytes(),
    )) {
        return Err(ApiError::Forbidden("bad CSRF token".into()));
    }
    let ctx = Ctx {
        caller: crate::auth::Caller {
            user: user.clone(),
            token_id: uuid::Uuid::nil(),
        },
        request_id: uuid::Uuid::now_v7().to_string(),
        source_ip: "portal".into(),
    };
    let minted = crate::api::tokens::mint_for(
        &st.db,
        &ctx,
        &user,
        kumo_api_types::TokenCreate {
            description: Some("kumo login".into()),
            expires_at: Some(chrono::Utc::now() + chrono::Duration::days(90)),
        },
    )
    .await?;
    let to = format!(
        "http://127.0.0.1:{}/?state={}&token={}",
        f.port, f.state, minted.token
    );
    Ok((StatusCode::SEE_OTHER, [(LOCATION, to)]).into_response())
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(dashboard))
        .route("/login/cli", get(cli_login).post(cli_allow))
        .route("/login", get(login))
        .route("/lang/{code}", get(switch_lang))
}
