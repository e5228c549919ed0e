//! The administrators' fleet-health page (`/admin/devices`): every
//! passed-through device's health as `app::device_health` lists it, by
//! host and state, with the operator's steps (repair, validate,
//! quarantine) posted back to the page. Others are refused as the API
//! refuses them.

use std::collections::BTreeSet;

use axum::extract::{Query, State};
use axum::http::header::LOCATION;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use kumo_api_types::{Device, DeviceAction, DeviceList, DeviceQuery, DeviceState, PageParams};
use kumo_topology::health::{DeviceSignals, PortSignals};
use kumo_web_portal::fleet_health::{
    done_notice, fleet_health_page, DeviceView, FleetHealth, Link, PortView,
};
use kumo_web_portal::i18n::Lang;
use kumo_web_portal::Viewer;
use openidconnect::url::form_urlencoded;
use serde::Deserialize;

use super::{ctx_of, html, lang, signed_in, Browser};
use crate::context::{Actor, AppState};
use crate::domain::device_health::OperatorAction;
use crate::error::ApiError;
use crate::http::sso::check_csrf;

const PAGE: &str = "/admin/devices";
/// The most device and port rows the page draws; the filter narrows.
const MOST_ROWS: usize = 500;

/// The page's query: the filter, and the device an operator's step just
/// changed (`host bdf`).
#[derive(Debug, Default, Deserialize)]
struct Filter {
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    done: Option<String>,
}

impl Filter {
    fn host(&self) -> Option<String> {
        self.host
            .as_deref()
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_owned)
    }

    fn state(&self) -> Result<Option<DeviceState>, ApiError> {
        match self.state.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(s) => DeviceState::parse(s).map(Some).ok_or_else(|| {
                ApiError::field(
                    "state",
                    "healthy, suspect, quarantined, repairing or validating",
                )
            }),
        }
    }

    /// The page with this filter, and `done` when given.
    fn href(&self, done: Option<&str>) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        if let Some(h) = self.host() {
            q.append_pair("host", &h);
        }
        if let Some(s) = self
            .state
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            q.append_pair("state", s);
        }
        if let Some(d) = done {
            q.append_pair("done", d);
        }
        let q = q.finish();
        if q.is_empty() {
            PAGE.to_owned()
        } else {
            format!("{PAGE}?{q}")
        }
    }
}

/// A device's last reading as `app::device_health` keeps it.
#[derive(Debug, Default, Deserialize)]
struct Reading {
    #[serde(default)]
    device: Option<DeviceSignals>,
    #[serde(default)]
    ports: Vec<PortSignals>,
}

/// Needing attention first: broken, doubtful, being worked on, healthy.
fn rank(s: DeviceState) -> u8 {
    match s {
        DeviceState::Quarantined => 0,
        DeviceState::Suspect => 1,
        DeviceState::Repairing => 2,
        DeviceState::Validating => 3,
        DeviceState::Healthy => 4,
    }
}

/// The operator's steps that change a device in `s`.
fn steps(s: DeviceState) -> Vec<String> {
    OperatorAction::ALL
        .into_iter()
        .filter(|op| op.apply(s).is_ok_and(|to| to != s))
        .map(|op| op.as_str().to_owned())
        .collect()
}

fn when(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M").to_string()
}

/// Everything the page shows, read as the session's user (admins only:
/// `app::device_health::list` refuses others).
async fn gather(st: &AppState, ctx: &Actor, l: Lang, f: &Filter) -> Result<FleetHealth, ApiError> {
    let q = DeviceQuery {
        host: f.host(),
        state: f.state()?,
    };
    let DeviceList {
        mut items,
        counts,
        quarantine_cap,
    } = crate::app::device_health::list(st, ctx, &q).await?;
    let hosts = crate::app::fleet::list(
        st,
        ctx,
        &PageParams {
            limit: Some(200),
            page_token: None,
        },
    )
    .await?
    .items
    .into_iter()
    .map(|h| h.name)
    .collect();
    items.sort_by(|a, b| (rank(a.state), &a.host, &a.bdf).cmp(&(rank(b.state), &b.host, &b.bdf)));
    let matched = items.len();
    items.truncate(MOST_ROWS);
    let ids: BTreeSet<uuid::Uuid> = items.iter().flat_map(|d| d.vms.iter().copied()).collect();
    let names = crate::store::vms::names_by_id(&st.db, ids).await?;
    let mut devices = Vec::with_capacity(items.len());
    let mut ports = Vec::new();
    for d in &items {
        let reading: Reading = d
            .signals
            .clone()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        devices.push(view(d, &reading, &names));
        ports.extend(reading.ports.iter().map(|p| PortView {
            host: d.host.clone(),
            bdf: p.bdf.clone(),
            device: p.device.clone(),
            port: p.port,
            state: p.state.clone(),
            carrier_changes: p.carrier_changes,
            ecn_marked: p.counters.get("np_ecn_marked_roce_packets").copied(),
            cnp_sent: p.counters.get("np_cnp_sent").copied(),
            cnp_handled: p.counters.get("rp_cnp_handled").copied(),
            out_of_sequence: p.counters.get("out_of_sequence").copied(),
        }));
    }
    let ports_matched = ports.len();
    ports.truncate(MOST_ROWS);
    let notice = f.done.as_deref().and_then(|d| {
        let (host, bdf) = d.split_once(' ')?;
        let now = devices
            .iter()
            .find(|v| v.host == host && v.bdf == bdf)
            .map(|v| v.state.as_str());
        Some(done_notice(l, &format!("{host} {bdf}"), now))
    });
    Ok(FleetHealth {
        counts: DeviceState::ALL
            .iter()
            .map(|s| {
                (
                    s.as_str().to_owned(),
                    counts.get(s.as_str()).copied().unwrap_or(0),
                )
            })
            .collect(),
        out_of_service: DeviceState::ALL
            .iter()
            .filter(|s| !s.placeable())
            .map(|s| counts.get(s.as_str()).copied().unwrap_or(0))
            .sum(),
        quarantine_cap,
        devices,
        matched,
        ports,
        ports_matched,
        hosts,
        host: q.host,
        state: q.state.map(|s| s.as_str().to_owned()),
        action: f.href(None),
        notice,
        error: None,
    })
}

fn view(
    d: &Device,
    r: &Reading,
    names: &std::collections::HashMap<uuid::Uuid, String>,
) -> DeviceView {
    let sig = r.device.as_ref();
    DeviceView {
        host: d.host.clone(),
        bdf: d.bdf.clone(),
        kind: d.kind.clone(),
        state: d.state.as_str().to_owned(),
        reason: d.reason.clone(),
        since: when(d.since),
        vms: d
            .vms
            .iter()
            .map(|id| names.get(id).cloned().unwrap_or_else(|| id.to_string()))
            .collect(),
        present: sig.map(|s| s.present),
        aer: sig
            .and_then(|s| s.aer)
            .map(|a| [a.correctable, a.nonfatal, a.fatal]),
        link: sig.and_then(|s| s.link).map(|k| Link {
            width: k.width,
            max_width: k.max_width,
            speed: k.speed,
            max_speed: k.max_speed,
        }),
        actions: steps(d.state),
    }
}

async fn show(
    st: &AppState,
    b: &Browser,
    f: &Filter,
) -> Result<Result<(Viewer, Actor), Response>, ApiError> {
    Ok(match signed_in(st, &b.headers, &f.href(None)).await? {
        Ok((viewer, user)) => Ok((viewer, ctx_of(&user, b.origin.clone()))),
        Err(r) => Err(r),
    })
}

async fn devices_page(
    State(st): State<AppState>,
    b: Browser,
    Query(f): Query<Filter>,
) -> Result<Response, ApiError> {
    let (viewer, ctx) = match show(&st, &b, &f).await? {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let l = lang(&b.headers);
    let view = gather(&st, &ctx, l, &f).await?;
    Ok(html(fleet_health_page(l, &viewer, &view)))
}

/// An operator's step, from a device's form.
#[derive(Debug, Deserialize)]
struct StepForm {
    /// Missing reads as empty, and is refused as a forged one is.
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    host: String,
    #[serde(default)]
    bdf: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    reason: Option<String>,
}

/// Done: back to the page (303) saying so. Refused: the page again with
/// the reason and the refusal's status; a missing device or a caller
/// who may not act stays the API's answer.
async fn device_step(
    State(st): State<AppState>,
    b: Browser,
    Query(f): Query<Filter>,
    axum::Form(form): axum::Form<StepForm>,
) -> Result<Response, ApiError> {
    let (viewer, ctx) = match show(&st, &b, &f).await? {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    check_csrf(&viewer.csrf, &form.csrf)?;
    let (host, bdf) = (form.host.trim(), form.bdf.trim());
    let body = DeviceAction {
        reason: form
            .reason
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(str::to_owned),
    };
    let done =
        crate::app::device_health::act(&st, &ctx, host, bdf, form.action.trim(), &body).await;
    match done {
        Ok(d) => Ok((
            StatusCode::SEE_OTHER,
            [(LOCATION, f.href(Some(&format!("{} {}", d.host, d.bdf))))],
        )
            .into_response()),
        Err(e @ (ApiError::NotFound(_) | ApiError::Forbidden(_))) => Err(e),
        Err(e) => {
            let l = lang(&b.headers);
            let mut view = gather(&st, &ctx, l, &Filter { done: None, ..f }).await?;
            view.error = Some(format!("{host} {bdf}: {e}"));
            let mut r = html(fleet_health_page(l, &viewer, &view));
            *r.status_mut() = e.status();
            Ok(r)
        }
    }
}

pub fn routes() -> Router<AppState> {
    Router::new().route(PAGE, get(devices_page).post(device_step))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_offers_the_steps_that_change_it() {
        assert_eq!(steps(DeviceState::Healthy), ["quarantine"]);
        assert_eq!(steps(DeviceState::Suspect), ["repair", "quarantine"]);
        assert_eq!(steps(DeviceState::Quarantined), ["repair", "validate"]);
        assert_eq!(steps(DeviceState::Repairing), ["validate", "quarantine"]);
        assert_eq!(steps(DeviceState::Validating), ["repair", "quarantine"]);
    }

    #[test]
    fn the_filter_survives_the_round_trip() {
        let f = Filter {
            host: Some(" gpu-001 ".into()),
            state: Some("quarantined".into()),
            done: None,
        };
        assert_eq!(
            f.href(Some("gpu-001 0000:17:00.0")),
            "/admin/devices?host=gpu-001&state=quarantined&done=gpu-001+0000%3A17%3A00.0"
        );
        assert_eq!(Filter::default().href(None), "/admin/devices");
        assert!(Filter {
            state: Some("broken".into()),
            ..Default::default()
        }
        .state()
        .is_err());
    }
}
