//! Federated login (OpenID Connect, authorization code flow with PKCE):
//! `GET /auth/providers` lists the configured institutions,
//! `GET /auth/login/{provider}` starts a flow, `GET /auth/callback` ends it
//! — `state` looked up (and spent: a flow is used once), the code
//! exchanged, the ID token verified (issuer, audience, expiry, signature,
//! nonce; keys fetched again when an unknown one signs), the e-mail domain
//! rule applied, the user provisioned by (issuer, subject) — and a
//! server-side session begins. `GET /auth/session` shows it; `POST
//! /auth/logout` ends it.

use axum::extract::{Path, Query, State};
use axum::http::header::{HOST, LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use openidconnect::core::{CoreAuthenticationFlow, CoreClient, CoreIdToken};
use openidconnect::{
    AccessToken, AuthorizationCode, ClientId, ClientSecret, CsrfToken, IssuerUrl, LogoutRequest,
    Nonce, OAuth2TokenResponse, PkceCodeChallenge, PkceCodeVerifier, PostLogoutRedirectUrl,
    RedirectUrl, Scope, TokenResponse,
};

use rand::RngCore;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set, TransactionTrait};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::config::OidcProvider;
use crate::context::AppState;
pub use crate::domain::names::safe_next;
use crate::entity::{login_flows, sessions, user_identities, users};
use crate::error::{is_unique_violation, ApiError};
use crate::oidc::Metadata;

pub const COOKIE: &str = "kumo_session";
/// The login page's CSRF cookie for the token form.
pub const LOGIN_CSRF_COOKIE: &str = "kumo_login_csrf";
/// A flow not finished within this is refused.
const FLOW_TTL_SECS: i64 = 600;
use crate::domain::sessions::ABSOLUTE_SECS;

// ------------------------------------------------------------ pure rules

/// Whether `email`'s domain is one of `allowed` or below one (`ac.jp`
/// allows `u-tokyo.ac.jp`); everything when `allowed` is empty.
pub fn email_allowed(email: &str, allowed: &[String]) -> bool {
    if allowed.is_empty() {
        return true;
    }
    let Some((_, domain)) = email.rsplit_once('@') else {
        return false;
    };
    let domain = domain.to_lowercase();
    allowed
        .iter()
        .any(|a| domain == *a || domain.ends_with(&format!(".{a}")))
}

/// A user name from an e-mail or subject: lowercase, only `[a-z0-9._-]`,
/// starting with a letter, at most 40 characters.
pub fn user_name_base(email: Option<&str>, subject: &str) -> String {
    let source = email
        .and_then(|e| e.split('@').next())
        .unwrap_or(subject)
        .to_lowercase();
    let mut name: String = source
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        name.insert(0, 'u');
    }
    if name.len() < 2 {
        name.push('0');
    }
    name
}

pub(crate) fn random_token() -> String {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    URL_SAFE_NO_PAD.encode(b)
}

// ------------------------------------------------------------ IO

pub(crate) fn http(st: &AppState) -> Result<&openidconnect::reqwest::Client, ApiError> {
    if let Some(c) = st.sso.http.get() {
        return Ok(c);
    }
    let c = openidconnect::reqwest::ClientBuilder::new()
        // Following redirects would open the server to SSRF.
        .redirect(openidconnect::reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(st.sso.http.get_or_init(|| c))
}

pub(crate) fn provider<'a>(st: &'a AppState, name: &str) -> Result<&'a OidcProvider, ApiError> {
    st.config
        .auth
        .oidc
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| ApiError::not_found(format!("login provider {name:?}")))
}

pub(crate) async fn metadata(
    st: &AppState,
    p: &OidcProvider,
    refresh: bool,
) -> Result<Metadata, ApiError> {
    if !refresh {
        let cached = st
            .sso
            .metadata
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&p.name)
            .cloned();
        if let Some(m) = cached {
            return Ok(m);
        }
    }
    let issuer = IssuerUrl::new(p.issuer.clone())
        .map_err(|e| ApiError::Internal(format!("issuer {}: {e}", p.issuer)))?;
    let m = Metadata::discover_async(issuer, http(st)?)
        .await
        .map_err(|e| {
            tracing::warn!(provider = %p.name, error = %e, "OpenID discovery failed");
            ApiError::Unavailable
        })?;
    st.sso
        .metadata
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p.name.clone(), m.clone());
    Ok(m)
}

/// Where browsers reach Kumo: the configured public URL, else this
/// request's host.
fn public_base(st: &AppState, headers: &HeaderMap) -> Result<String, ApiError> {
    match &st.config.auth.public_url {
        Some(u) => Ok(u.trim_end_matches('/').to_owned()),
        None => headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .map(|host| format!("http://{host}"))
            .ok_or_else(|| ApiError::validation("no Host header")),
    }
}

fn redirect_uri(st: &AppState, headers: &HeaderMap) -> Result<RedirectUrl, ApiError> {
    RedirectUrl::new(format!("{}/auth/callback", public_base(st, headers)?))
        .map_err(|e| ApiError::Internal(e.to_string()))
}

#[derive(Serialize)]
struct ProviderInfo {
    name: String,
    display_name: String,
}

async fn providers(State(st): State<AppState>) -> axum::Json<Vec<ProviderInfo>> {
    axum::Json(
        st.config
            .auth
            .oidc
            .iter()
            .map(|p| ProviderInfo {
                name: p.name.clone(),
                display_name: p.display_name.clone(),
            })
            .collect(),
    )
}

#[derive(Deserialize)]
struct LoginParams {
    next: Option<String>,
}

fn redirect(to: &str) -> Response {
    (StatusCode::FOUND, [(LOCATION, to.to_owned())]).into_response()
}

async fn login(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<LoginParams>,
) -> Result<Response, ApiError> {
    let p = provider(&st, &name)?.clone();
    let m = metadata(&st, &p, false).await?;
    let client = CoreClient::from_provider_metadata(
        m,
        ClientId::new(p.client_id.clone()),
        Some(ClientSecret::new(p.client_secret.clone())),
    )
    .set_redirect_uri(redirect_uri(&st, &headers)?);
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let mut req = client.authorize_url(
        CoreAuthenticationFlow::AuthorizationCode,
        CsrfToken::new_random,
        Nonce::new_random,
    );
    for s in p.scopes.iter().filter(|s| *s != "openid") {
        req = req.add_scope(Scope::new(s.clone()));
    }
    let (url, state, nonce) = req.set_pkce_challenge(challenge).url();
    login_flows::ActiveModel {
        state: Set(state.secret().clone()),
        provider: Set(p.name.clone()),
        pkce_verifier: Set(verifier.secret().clone()),
        nonce: Set(nonce.secret().clone()),
        next: Set(safe_next(q.next.as_deref())),
        created_at: Set(Utc::now()),
    }
    .insert(&st.db)
    .await?;
    Ok(redirect(url.as_str()))
}

#[derive(Deserialize)]
struct CallbackParams {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// The claims Kumo keeps besides the standard ones, read from the verified
/// ID token's payload.
#[derive(Deserialize, Default)]
struct ExtraClaims {
    eppn: Option<String>,
    affiliation: Option<serde_json::Value>,
}

fn extra_claims(id_token: &str) -> ExtraClaims {
    id_token
        .split('.')
        .nth(1)
        .and_then(|p| URL_SAFE_NO_PAD.decode(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

pub(crate) struct Identity {
    /// The verified ID token as received, kept for logout.
    id_token: String,
    issuer: String,
    subject: String,
    email: Option<String>,
    name: Option<String>,
    eppn: Option<String>,
    affiliation: Option<String>,
}

async fn callback(
    State(st): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<CallbackParams>,
) -> Result<Response, ApiError> {
    if let Some(e) = q.error {
        return Err(ApiError::Forbidden(format!(
            "the provider refused the login: {e}"
        )));
    }
    let (Some(code), Some(state)) = (q.code, q.state) else {
        return Err(ApiError::validation("code and state are required"));
    };
    // A flow is spent by its first use: a forged or replayed state finds nothing.
    let txn = st.db.begin().await?;
    let flow = login_flows::Entity::find_by_id(state.clone())
        .one(&txn)
        .await?
        .ok_or_else(|| ApiError::Forbidden("unknown or used login state".into()))?;
    login_flows::Entity::delete_by_id(state).exec(&txn).await?;
    txn.commit().await?;
    if (Utc::now() - flow.created_at).num_seconds() > FLOW_TTL_SECS {
        return Err(ApiError::Forbidden(
            "the login took too long; start again".into(),
        ));
    }
    let p = provider(&st, &flow.provider)?.clone();
    let identity = verify(&st, &p, &headers, code, &flow).await?;
    let user = admit(&st, &p, &identity).await?;
    tracing::info!(provider = %p.name, user = %user, "federated login");
    begin_session(
        &st,
        user,
        Some((p.name.clone(), identity.id_token)),
        None,
        flow.next,
    )
    .await
}

/// A new session for `user` (with the provider and ID token of a
/// federated login) and the redirect that sets its cookie.
/// Starts a portal session. One opened with an API token (`token`) ends
/// when that token is revoked or expires.
async fn begin_session(
    st: &AppState,
    user: Uuid,
    federated: Option<(String, String)>,
    token: Option<Uuid>,
    next: String,
) -> Result<Response, ApiError> {
    let secret = random_token();
    let now = st.config.clock.now();
    let (provider, id_token) = federated.unzip();
    sessions::ActiveModel {
        id: Set(crate::app::auth::hash_secret(&secret)),
        user_id: Set(user),
        csrf: Set(random_token()),
        created_at: Set(now),
        last_seen_at: Set(now),
        provider: Set(provider),
        id_token: Set(id_token),
        token_id: Set(token),
    }
    .insert(&st.db)
    .await?;
    let secure = st
        .config
        .auth
        .public_url
        .as_deref()
        .is_some_and(|u| u.starts_with("https://"));
    let cookie = format!(
        "{COOKIE}={secret}; Path=/; HttpOnly; SameSite=Lax; Max-Age={ABSOLUTE_SECS}{}",
        if secure { "; Secure" } else { "" }
    );
    Ok((StatusCode::FOUND, [(LOCATION, next), (SET_COOKIE, cookie)]).into_response())
}

#[derive(Deserialize)]
struct TokenLogin {
    token: String,
    csrf: String,
    next: Option<String>,
}

/// Local login for administrators and service users: an API token
/// (checked as the API checks it) begins a browser session.
async fn token_login(
    State(st): State<AppState>,
    headers: HeaderMap,
    axum::Form(f): axum::Form<TokenLogin>,
) -> Result<Response, ApiError> {
    // Without it another site could sign a browser in as someone else.
    let expected = cookie(&headers, LOGIN_CSRF_COOKIE).unwrap_or_default();
    if expected.is_empty() {
        return Err(ApiError::Forbidden("open the sign-in page first".into()));
    }
    check_csrf(&expected, &f.csrf)?;
    let caller =
        crate::app::auth::authenticate(&st.db, f.token.trim(), st.config.clock.now()).await?;
    tracing::info!(user = %caller.user.name, "token login to the portal");
    begin_session(
        &st,
        caller.user.id,
        None,
        Some(caller.token_id),
        safe_next(f.next.as_deref()),
    )
    .await
}

/// The user of a verified identity, provisioned on first login, if the
/// provider's e-mail domain rule lets them in.
pub(crate) async fn admit(
    st: &AppState,
    p: &OidcProvider,
    identity: &Identity,
) -> Result<Uuid, ApiError> {
    if !email_allowed(
        identity.email.as_deref().unwrap_or(""),
        &p.allowed_email_domains,
    ) {
        return Err(ApiError::Forbidden(format!(
            "{} may not log in here: e-mail addresses under {} only",
            identity
                .email
                .as_deref()
                .unwrap_or("an account without an e-mail"),
            p.allowed_email_domains.join(", ")
        )));
    }
    provision(st, identity).await
}

fn refused(p: &OidcProvider, what: String) -> ApiError {
    tracing::warn!(provider = %p.name, "login refused: {what}");
    ApiError::Forbidden(format!("login refused: {what}"))
}

async fn verify(
    st: &AppState,
    p: &OidcProvider,
    headers: &HeaderMap,
    code: String,
    flow: &login_flows::Model,
) -> Result<Identity, ApiError> {
    let refused = |what: String| refused(p, what);
    let m = metadata(st, p, false).await?;
    let token = CoreClient::from_provider_metadata(
        m,
        ClientId::new(p.client_id.clone()),
        Some(ClientSecret::new(p.client_secret.clone())),
    )
    .set_redirect_uri(redirect_uri(st, headers)?)
    .exchange_code(AuthorizationCode::new(code))
    .map_err(|e| ApiError::Internal(e.to_string()))?
    .set_pkce_verifier(PkceCodeVerifier::new(flow.pkce_verifier.clone()))
    .request_async(http(st)?)
    .await
    .map_err(|e| refused(format!("the code was not accepted ({e})")))?;
    let id_token = token
        .id_token()
        .ok_or_else(|| refused("no ID token".into()))?
        .clone();
    identity_of(st, p, &id_token, token.access_token(), Some(&flow.nonce)).await
}

/// Who an ID token from `p` says the user is: verified (issuer, audience,
/// expiry, signature — the provider's keys fetched again once if they
/// fail — and the nonce, when the flow sent one), completed from userinfo
/// where the token leaves claims out.
pub(crate) async fn identity_of(
    st: &AppState,
    p: &OidcProvider,
    id_token: &CoreIdToken,
    access_token: &AccessToken,
    nonce: Option<&str>,
) -> Result<Identity, ApiError> {
    let refused = |what: String| refused(p, what);
    let check_nonce = |got: Option<&Nonce>| -> Result<(), String> {
        match nonce {
            None => Ok(()),
            Some(want) if got.is_some_and(|g| constant_time_eq(g.secret(), want)) => Ok(()),
            Some(_) => Err("the nonce does not match the login's".into()),
        }
    };
    let verifier_of = |m: Metadata| {
        CoreClient::from_provider_metadata(
            m,
            ClientId::new(p.client_id.clone()),
            Some(ClientSecret::new(p.client_secret.clone())),
        )
    };
    let mut m = metadata(st, p, false).await?;
    let claims = match id_token.claims(&verifier_of(m.clone()).id_token_verifier(), check_nonce) {
        Ok(c) => c.clone(),
        // Keys rotate: fetch them again once before refusing.
        Err(openidconnect::ClaimsVerificationError::SignatureVerification(_)) => {
            m = metadata(st, p, true).await?;
            id_token
                .claims(&verifier_of(m.clone()).id_token_verifier(), check_nonce)
                .map_err(|e| refused(e.to_string()))?
                .clone()
        }
        Err(e) => return Err(refused(e.to_string())),
    };
    let extra = extra_claims(&id_token.to_string());
    let mut identity = Identity {
        id_token: id_token.to_string(),
        issuer: claims.issuer().to_string(),
        subject: claims.subject().to_string(),
        email: claims.email().map(|e| e.to_string().to_lowercase()),
        name: claims
            .name()
            .and_then(|n| n.get(None))
            .map(|n| n.to_string()),
        eppn: extra.eppn,
        affiliation: extra.affiliation.map(claim_text),
    };
    // Providers that keep the ID token small answer the rest at userinfo.
    if identity.email.is_none() || identity.eppn.is_none() {
        if let Some(endpoint) = m.userinfo_endpoint() {
            let info: serde_json::Value = http(st)?
                .get(endpoint.url().as_str())
                .bearer_auth(access_token.secret())
                .send()
                .await
                .and_then(|r| r.error_for_status())
                .map_err(|e| refused(format!("userinfo: {e}")))?
                .json()
                .await
                .map_err(|e| refused(format!("userinfo: {e}")))?;
            if info["sub"].as_str() != Some(identity.subject.as_str()) {
                return Err(refused("userinfo is about someone else".into()));
            }
            let text = |k: &str| info.get(k).cloned().map(claim_text);
            identity.email = identity.email.or(text("email").map(|e| e.to_lowercase()));
            identity.name = identity.name.or(text("name"));
            identity.eppn = identity.eppn.or(text("eppn"));
            identity.affiliation = identity.affiliation.or(text("affiliation"));
        }
    }
    Ok(identity.cleaned())
}

impl Identity {
    /// What an institution says about a person is outside data: names and
    /// affiliations lose their control characters and are bounded (a
    /// login is not refused over a provider's odd display name); an
    /// e-mail address that is not a clean one is dropped, so it can
    /// neither be stored nor pass a domain check.
    fn cleaned(self) -> Identity {
        use crate::domain::names;
        Identity {
            email: self.email.filter(|e| names::email("email", e).is_ok()),
            name: self.name.map(|n| names::cleaned(&n, 200)),
            eppn: self.eppn.map(|n| names::cleaned(&n, 254)),
            affiliation: self.affiliation.map(|n| names::cleaned(&n, 1000)),
            ..self
        }
    }
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    bool::from(subtle::ConstantTimeEq::ct_eq(a.as_bytes(), b.as_bytes()))
}

fn claim_text(v: serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    }
}

/// The user of an identity, created on its first login.
async fn provision(st: &AppState, id: &Identity) -> Result<Uuid, ApiError> {
    if let Some(known) =
        user_identities::Entity::find_by_id((id.issuer.clone(), id.subject.clone()))
            .one(&st.db)
            .await?
    {
        return Ok(known.user_id);
    }
    let base = user_name_base(id.email.as_deref(), &id.subject);
    for n in 0..50 {
        let name = if n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        if !crate::domain::names::is_user_name(&name) {
            continue;
        }
        let txn = st.db.begin().await?;
        let user = users::ActiveModel {
            id: Set(Uuid::now_v7()),
            name: Set(name),
            display_name: Set(id
                .name
                .clone()
                .or_else(|| id.email.clone())
                .unwrap_or_else(|| id.subject.clone())
                .chars()
                .take(200)
                .collect()),
            email: Set(id.email.clone()),
            kind: Set(kumo_api_types::UserKind::Federated.as_str().into()),
            is_admin: Set(false),
            disabled: Set(false),
            created_at: Set(Utc::now()),
        };
        let user = match user.insert(&txn).await {
            Ok(u) => u,
            Err(e) if is_unique_violation(&e) => continue, // name taken: next
            Err(e) => return Err(e.into()),
        };
        let identity = user_identities::ActiveModel {
            issuer: Set(id.issuer.clone()),
            subject: Set(id.subject.clone()),
            user_id: Set(user.id),
            email: Set(id.email.clone()),
            eppn: Set(id.eppn.clone()),
            affiliation: Set(id.affiliation.clone()),
            created_at: Set(Utc::now()),
        };
        match identity.insert(&txn).await {
            Ok(_) => {}
            // The same person logging in twice at once: the other won.
            Err(e) if is_unique_violation(&e) => {
                drop(txn);
                return Box::pin(provision(st, id)).await;
            }
            Err(e) => return Err(e.into()),
        }
        txn.commit().await?;
        return Ok(user.id);
    }
    Err(ApiError::Conflict(
        "no free user name for this identity".into(),
    ))
}

/// A cookie's value from the request.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// A form's CSRF token against the session's, in constant time.
pub fn check_csrf(expected: &str, given: &str) -> Result<(), ApiError> {
    if constant_time_eq(expected, given) {
        Ok(())
    } else {
        Err(ApiError::Forbidden("bad CSRF token".into()))
    }
}

/// The session a request carries, if it is alive (idle and absolute
/// limits); touches it.
pub async fn session_of(
    st: &AppState,
    headers: &HeaderMap,
) -> Result<Option<(sessions::Model, users::Model)>, ApiError> {
    let Some(secret) = cookie(headers, COOKIE) else {
        return Ok(None);
    };
    let id = crate::app::auth::hash_secret(&secret);
    let Some(s) = sessions::Entity::find_by_id(id.clone()).one(&st.db).await? else {
        return Ok(None);
    };
    let now = st.config.clock.now();
    if expired(&s, now) {
        sessions::Entity::delete_by_id(id).exec(&st.db).await?;
        return Ok(None);
    }
    let Some(user) = users::Entity::find_by_id(s.user_id).one(&st.db).await? else {
        return Ok(None);
    };
    // A disabled user, or a session whose token was revoked or expired,
    // is signed out for good.
    let token_dead = match s.token_id {
        None => false,
        Some(t) => crate::entity::api_tokens::Entity::find_by_id(t)
            .one(&st.db)
            .await?
            .is_none_or(|t| t.revoked_at.is_some() || t.expires_at.is_some_and(|e| e <= now)),
    };
    if user.disabled || token_dead {
        sessions::Entity::delete_by_id(id).exec(&st.db).await?;
        return Ok(None);
    }
    if (now - s.last_seen_at).num_seconds() > 60 {
        sessions::Entity::update_many()
            .col_expr(
                sessions::Column::LastSeenAt,
                sea_orm::sea_query::Expr::value(now),
            )
            .filter(sessions::Column::Id.eq(s.id.clone()))
            .exec(&st.db)
            .await?;
    }
    Ok(Some((s, user)))
}

pub fn expired(s: &sessions::Model, now: DateTime<Utc>) -> bool {
    crate::domain::sessions::expired(s.created_at, s.last_seen_at, now)
}

#[derive(Serialize)]
struct SessionInfo {
    user: String,
    display_name: String,
    email: Option<String>,
    kind: String,
    csrf: String,
}

async fn session(State(st): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    match session_of(&st, &headers).await? {
        Some((s, u)) => Ok(axum::Json(SessionInfo {
            user: u.name,
            display_name: u.display_name,
            email: u.email,
            kind: u.kind,
            csrf: s.csrf,
        })
        .into_response()),
        None => Err(ApiError::Unauthenticated("no session".into())),
    }
}

#[derive(Deserialize)]
struct LogoutForm {
    csrf: String,
}

/// Ends the session; a federated one then goes on to its provider's end
/// session endpoint (RP-initiated logout) when the provider has one, and
/// the provider sends the browser back to the chooser.
async fn logout(
    State(st): State<AppState>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<LogoutForm>,
) -> Result<Response, ApiError> {
    let mut to = "/".to_owned();
    if let Some((s, _)) = session_of(&st, &headers).await? {
        check_csrf(&s.csrf, &form.csrf)?;
        sessions::Entity::delete_by_id(s.id.clone())
            .exec(&st.db)
            .await?;
        if let Some(url) = end_session_url(&st, &headers, &s).await {
            to = url;
        }
    }
    Ok((
        StatusCode::FOUND,
        [
            (LOCATION, to),
            (
                SET_COOKIE,
                format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0"),
            ),
        ],
    )
        .into_response())
}

/// Where a federated session's logout continues at its provider, if the
/// provider offers RP-initiated logout. A provider that cannot be asked
/// only loses its own session's end: Kumo's is over either way.
async fn end_session_url(
    st: &AppState,
    headers: &HeaderMap,
    s: &sessions::Model,
) -> Option<String> {
    let p = provider(st, s.provider.as_deref()?).ok()?.clone();
    let m = metadata(st, &p, false).await.ok()?;
    let endpoint = m.additional_metadata().end_session_endpoint.clone()?;
    let back = format!("{}/login", public_base(st, headers).ok()?);
    let mut req = LogoutRequest::from(endpoint)
        .set_client_id(ClientId::new(p.client_id.clone()))
        .set_post_logout_redirect_uri(PostLogoutRedirectUrl::new(back).ok()?);
    if let Some(t) = s
        .id_token
        .as_deref()
        .and_then(|t| t.parse::<CoreIdToken>().ok())
    {
        req = req.set_id_token_hint(&t);
    }
    Some(req.http_get_url().to_string())
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/auth/providers", get(providers))
        .route("/auth/login/{provider}", get(login))
        .route("/auth/callback", get(callback))
        .route("/auth/session", get(session))
        .route("/auth/logout", post(logout))
        .route("/auth/token", post(token_login))
        .route("/static/login.js", get(login_js))
}

/// The chooser's script, served as a file so no page needs inline script.
async fn login_js() -> Response {
    (
        [
            (
                axum::http::header::CONTENT_TYPE,
                "text/javascript; charset=utf-8",
            ),
            (axum::http::header::CACHE_CONTROL, "max-age=300"),
        ],
        kumo_web_portal::LOGIN_JS,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn email_domains_match_by_suffix_at_a_label() {
        let allowed = vec!["ac.jp".to_owned(), "go.jp".to_owned()];
        assert!(email_allowed("aiko@u-tokyo.ac.jp", &allowed));
        assert!(email_allowed("x@AC.JP", &allowed));
        assert!(!email_allowed("eve@evilac.jp", &allowed));
        assert!(!email_allowed("eve@example.com", &allowed));
        assert!(!email_allowed("no-at-sign", &allowed));
        assert!(email_allowed("anyone@example.com", &[]));
    }

    #[test]
    fn user_names_from_claims() {
        assert_eq!(
            user_name_base(Some("Aiko.Tanaka@u-tokyo.ac.jp"), "s"),
            "aiko.tanaka"
        );
        assert_eq!(user_name_base(Some("1st+tag@x.jp"), "s"), "u1st-tag");
        assert_eq!(user_name_base(None, "Z"), "z0");
        assert!(crate::domain::names::is_user_name(&user_name_base(
            Some("名前@x.jp"),
            "s"
        )));
    }
}
