use axum::extract::State;
use axum::http::StatusCode;
use chrono::Utc;
use kumo_api_types::{Page, PageParams, Template, TemplateCreate};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Set,
    TransactionTrait,
};
use uuid::Uuid;

use super::Problems;
use crate::app::access::require_admin;
use crate::app::audit;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::entity::templates;
use crate::error::{conflict_if_unique, ApiError};
use crate::http::extract::{Json, Query};

fn to_api(t: templates::Model) -> Template {
    Template {
        id: t.id,
        name: t.name,
        image_path: t.image_path,
        os: t.os,
        default_user: t.default_user,
        kernel_path: t.kernel_path,
        initrd_path: t.initrd_path,
        kernel_cmdline: t.kernel_cmdline,
        created_at: t.created_at,
    }
}

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
    require_admin(&ctx.caller, "creating templates")?;
    names::tenant_name("name", &body.name)?;
    names::text("os", &body.os, 63)?;
    names::user_name("default_user", &body.default_user)?;
    host_path("image_path", &body.image_path)?;
    for (field, p) in [
        ("kernel_path", &body.kernel_path),
        ("initrd_path", &body.initrd_path),
    ] {
        if let Some(p) = p {
            host_path(field, p)?;
        }
    }
    if body.kernel_path.is_none() && (body.initrd_path.is_some() || body.kernel_cmdline.is_some()) {
        return Err(ApiError::field(
            "kernel_path",
            "initrd_path and kernel_cmdline need a kernel_path",
        ));
    }
    if let Some(c) = &body.kernel_cmdline {
        names::text("kernel_cmdline", c, 1024)?;
    }
    let txn = st.db.begin().await?;
    let t = templates::ActiveModel {
        id: Set(Uuid::now_v7()),
        name: Set(body.name.clone()),
        image_path: Set(body.image_path),
        os: Set(body.os),
        default_user: Set(body.default_user),
        kernel_path: Set(body.kernel_path),
        initrd_path: Set(body.initrd_path),
        kernel_cmdline: Set(body.kernel_cmdline),
        created_at: Set(Utc::now()),
    }
    .insert(&txn)
    .await
    .map_err(|e| {
        conflict_if_unique(e, || {
            format!("a template named {:?} already exists", body.name)
        })
    })?;
    audit::record(&txn, &ctx, "template.create", None, &t.name).await?;
    txn.commit().await?;
    Ok((StatusCode::CREATED, axum::Json(to_api(t))))
}

/// List VM images (everyone signed in).
#[utoipa::path(
    get, path = "/api/v1/templates", tag = "templates",
    params(PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Template>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    _ctx: Actor,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Template>>, ApiError> {
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = templates::Entity::find().order_by_asc(templates::Column::Name);
    if let Some(after) = &paging.after {
        query = query.filter(templates::Column::Name.gt(after.as_str()));
    }
    let rows = query.limit(paging.fetch()).all(&st.db).await?;
    let (rows, next) = paging.finish(rows, |t| t.name.clone());
    Ok(axum::Json(Page {
        items: rows.into_iter().map(to_api).collect(),
        next_page_token: next,
    }))
}

/// An absolute path on the hosts, without `..` or control characters.
fn host_path(field: &str, p: &str) -> Result<(), ApiError> {
    names::text(field, p, 1024)?;
    if !p.starts_with('/') || p.split('/').any(|c| c == "..") {
        return Err(ApiError::field(
            field,
            "an absolute path on the hosts, without `..`",
        ));
    }
    Ok(())
}
