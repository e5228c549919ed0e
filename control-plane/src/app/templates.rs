//! VM image use cases: registered by platform admins, listed by everyone.

use kumo_api_types::{Page, PageParams, Template, TemplateCreate};
use sea_orm::{ActiveModelTrait, Set, TransactionTrait};
use uuid::Uuid;

use crate::app::access::require_admin;
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::entity::templates;
use crate::error::{conflict_if_unique, ApiError};

/// A template as the API shows it: the host paths only to platform
/// admins, who registered them.
pub fn view(t: templates::Model, caller: &crate::context::Caller) -> Template {
    let admin = caller.is_admin();
    Template {
        id: t.id,
        name: t.name,
        image_path: admin.then_some(t.image_path),
        os: t.os,
        default_user: t.default_user,
        kernel_path: t.kernel_path.filter(|_| admin),
        initrd_path: t.initrd_path.filter(|_| admin),
        kernel_cmdline: t.kernel_cmdline,
        created_at: t.created_at,
    }
}

/// A platform admin registers a VM image.
pub async fn create(
    st: &AppState,
    actor: &Actor,
    body: TemplateCreate,
) -> Result<Template, ApiError> {
    require_admin(&actor.caller, "creating templates")?;
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
        created_at: Set(st.config.clock.now()),
    }
    .insert(&txn)
    .await
    .map_err(|e| {
        conflict_if_unique(e, || {
            format!("a template named {:?} already exists", body.name)
        })
    })?;
    audit::record(&txn, actor, "template.create", None, &t.name).await?;
    txn.commit().await?;
    Ok(view(t, &actor.caller))
}

/// One page of the VM images, by name (everyone signed in).
pub async fn list(
    st: &AppState,
    actor: &Actor,
    params: &PageParams,
) -> Result<Page<Template>, ApiError> {
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let rows = crate::store::templates::page(&st.db, &paging).await?;
    let (rows, next) = paging.finish(rows, |t| t.name.clone());
    Ok(Page {
        items: rows.into_iter().map(|t| view(t, &actor.caller)).collect(),
        next_page_token: next,
    })
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
