use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{Page, PageParams, Template, TemplateCreate};

use super::Problems;
use crate::context::Actor;
use crate::context::AppState;
use crate::error::ApiError;
use crate::http::extract::{Json, Query};

/// Register a VM image (platform admins).
#[utoipa::path(
    post, path = "/api/v1/templates", tag = "templates",
    request_body = TemplateCreate,
    params(("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries")),
    responses((status = 201, description = "Created", body = Template), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Json(body): Json<TemplateCreate>,
) -> Result<(StatusCode, axum::Json<Template>), ApiError> {
    let t = crate::app::templates::create(&st, &ctx, body).await?;
    Ok((StatusCode::CREATED, axum::Json(t)))
}

/// List VM images (everyone signed in).
#[utoipa::path(
    get, path = "/api/v1/templates", tag = "templates",
    params(PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Template>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Template>>, ApiError> {
    Ok(axum::Json(
        crate::app::templates::list(&st, &ctx, &q).await?,
    ))
}
