//! The portal's listing pages: a project's clusters, segments and members,
//! the user's API tokens, and the administrators' hosts, projects, rates
//! and join tokens. Each is a [`Listing`] built from the operations the
//! API calls, run as the session's user, so a page shows and a form does
//! exactly what the API allows that user; a refused form comes back as
//! the page with the API's reason.

use axum::extract::{Path, State};
use axum::http::header::LOCATION;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use kumo_api_types as api;
use kumo_web_portal::i18n::{help, t, word, Lang, Msg};
use kumo_web_portal::listing::{heatmap_svg, Cell, Field, Form, Input, Listing, Section};
use kumo_web_portal::Viewer;

use super::{ctx_of, first_page, html, lang, number, signed_in, text, Browser, Fields};
use crate::context::AppState;
use crate::error::ApiError;
use crate::http::sso::check_csrf;

/// Which listing a request is about.
#[derive(Debug, Clone)]
enum Page {
    Clusters(String),
    Segments(String),
    Volumes(String),
    Shares(String),
    Members(String),
    Tokens,
    Hosts,
    Host(String),
    Tenants,
    Rates,
    JoinTokens,
}

impl Page {
    fn href(&self) -> String {
        match self {
            Page::Clusters(t) => format!("/t/{t}/clusters"),
            Page::Segments(t) => format!("/t/{t}/segments"),
            Page::Volumes(t) => format!("/t/{t}/volumes"),
            Page::Shares(t) => format!("/t/{t}/shares"),
            Page::Members(t) => format!("/t/{t}/members"),
            Page::Tokens => "/tokens".into(),
            Page::Hosts => "/admin/hosts".into(),
            Page::Host(h) => format!("/admin/hosts/{h}"),
            Page::Tenants => "/admin/tenants".into(),
            Page::Rates => "/admin/rates".into(),
            Page::JoinTokens => "/admin/join-tokens".into(),
        }
    }

    fn tenant(&self) -> Option<&str> {
        match self {
            Page::Clusters(t)
            | Page::Segments(t)
            | Page::Volumes(t)
            | Page::Shares(t)
            | Page::Members(t) => Some(t),
            _ => None,
        }
    }
}

/// The session's user with what a page needs to answer them.
struct Visit {
    st: AppState,
    lang: Lang,
    viewer: Viewer,
    ctx: crate::context::Actor,
}

/// The first 200 of a list: what a page shows.
fn when(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M").to_string()
}

fn delete_button(l: Lang, action: String) -> Cell {
    Cell::Button {
        action,
        label: word(l, "delete"),
    }
}

/// A page of one table with its create form, posted back to the page.
fn table_page(
    heading: String,
    columns: Vec<String>,
    rows: Vec<Vec<Cell>>,
    empty: String,
    page: &Page,
    submit: String,
    fields: Vec<Field>,
) -> Listing {
    Listing {
        heading,
        sections: vec![Section {
            columns,
            rows,
            empty,
            form: Some(Form {
                action: page.href(),
                submit,
                fields,
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn listing(v: &Visit, page: &Page) -> Result<Listing, ApiError> {
    Ok(match page {
        Page::Clusters(tenant) => clusters_listing(v, page, tenant).await?,
        Page::Segments(tenant) => segments_listing(v, page, tenant).await?,
        Page::Volumes(tenant) => volumes_listing(v, page, tenant).await?,
        Page::Shares(tenant) => shares_listing(v, page, tenant).await?,
        Page::Members(tenant) => members_listing(v, page, tenant).await?,
        Page::Tokens => tokens_listing(v, page).await?,
        Page::Hosts => hosts_listing(v).await?,
        Page::Host(name) => host_listing(v, name).await?,
        Page::Tenants => tenants_listing(v, page).await?,
        Page::Rates => rates_listing(v, page).await?,
        Page::JoinTokens => join_tokens_listing(v, page).await?,
    })
}

/// The project's segments to choose from ("—": none).
async fn segment_choice(v: &Visit, tenant: &str) -> Result<Input, ApiError> {
    let segments = crate::app::segments::list(&v.st, &v.ctx, tenant, &first_page()).await?;
    Ok(Input::choices(
        "—",
        segments.items.into_iter().map(|s| s.name).collect(),
    ))
}

/// The project's VMs to choose from ("—": none).
async fn vm_choice(v: &Visit, tenant: &str) -> Result<Input, ApiError> {
    let vms = crate::app::vms::list(&v.st, &v.ctx, tenant, &first_page()).await?;
    Ok(Input::choices(
        "—",
        vms.items.into_iter().map(|vm| vm.name).collect(),
    ))
}

async fn clusters_listing(v: &Visit, page: &Page, tenant: &str) -> Result<Listing, ApiError> {
    let l = v.lang;
    let empty = t(l, Msg::Empty).to_owned();
    let tx = |m| t(l, m).to_owned();
    let items = crate::app::clusters::list(&v.st, &v.ctx, tenant, &first_page())
        .await?
        .items;
    let rows = items
        .iter()
        .map(|c| {
            vec![
                Cell::text(&c.name),
                Cell::text(&c.state),
                Cell::Code(
                    std::iter::once(word(l, c.health.as_str()))
                        .chain(
                            c.problems
                                .iter()
                                .map(|p| format!("{}: {}", p.member, p.detail)),
                        )
                        .collect::<Vec<_>>()
                        .join("\n"),
                ),
                Cell::text(c.size.to_string()),
                Cell::text(c.spec.gpus.to_string()),
                Cell::Code(
                    c.members
                        .iter()
                        .map(|m| {
                            format!(
                                "{} {} {}",
                                m.name,
                                m.state.as_str(),
                                m.host.as_deref().unwrap_or("-")
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n"),
                ),
                match c.health {
                    api::ClusterHealth::Degraded => Cell::Button {
                        action: format!("/t/{tenant}/clusters/{}/repair", c.name),
                        label: word(l, "repair"),
                    },
                    _ => Cell::text(""),
                },
                delete_button(l, format!("/t/{tenant}/clusters/{}/delete", c.name)),
            ]
        })
        .collect();
    Ok(table_page(
        format!("{tenant} — {}", t(l, Msg::Clusters)),
        vec![
            tx(Msg::Name),
            tx(Msg::State),
            word(l, "Health"),
            tx(Msg::Size),
            tx(Msg::GpusEach),
            tx(Msg::VmsTitle),
            String::new(),
            String::new(),
        ],
        rows,
        empty,
        page,
        tx(Msg::Create),
        vec![
            kumo_web_portal::listing::name_field(l),
            Field::new("size", t(l, Msg::Size), Input::NUMBER)
                .required()
                .help(help(l, "cluster_size")),
            Field::new("gpus", t(l, Msg::GpusEach), Input::NUMBER).help(help(l, "cluster_gpus")),
            Field::new(
                "network",
                t(l, Msg::Segment),
                segment_choice(v, tenant).await?,
            )
            .answers(&["networks"])
            .help(help(l, "network")),
            Field::new("spot", &word(l, "Spot VM"), Input::Checkbox)
                .answers(&["service_level"])
                .help(help(l, "spot")),
            Field::new("auto_repair", &word(l, "Repair by itself"), Input::Checkbox)
                .help(help(l, "auto_repair")),
            Field::new("spares", &word(l, "Spares"), Input::NUMBER).help(help(l, "cluster_spares")),
            Field::new("queue", &word(l, "Wait for room"), Input::Checkbox).help(help(l, "queue")),
            Field::new("reservation", &word(l, "Reservation"), Input::Text)
                .help(help(l, "reservation")),
            kumo_web_portal::share_field(l),
        ],
    ))
}

async fn segments_listing(v: &Visit, page: &Page, tenant: &str) -> Result<Listing, ApiError> {
    let l = v.lang;
    let empty = t(l, Msg::Empty).to_owned();
    let tx = |m| t(l, m).to_owned();
    let items = crate::app::segments::list(&v.st, &v.ctx, tenant, &first_page())
        .await?
        .items;
    let rows = items
        .iter()
        .map(|s| {
            vec![
                Cell::text(&s.name),
                Cell::text(format!("{:?}", s.kind).to_lowercase()),
                Cell::Code(s.cidr.clone()),
                Cell::text(s.mtu.to_string()),
                Cell::text(match s.vlan {
                    Some(vlan) => format!("{} / VLAN {vlan}", s.vni),
                    None => s.vni.to_string(),
                }),
                Cell::text(s.attachments.to_string()),
                Cell::Code(
                    s.ingress
                        .iter()
                        .map(|r| r.to_string())
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
                match (&s.edge, s.egress) {
                    (
                        Some(api::SegmentEdge {
                            snat_address: Some(a),
                            ..
                        }),
                        true,
                    ) => Cell::Code(a.clone()),
                    (_, true) => Cell::text("…"),
                    (_, false) => Cell::text(tx(Msg::EgressOff)),
                },
                delete_button(l, format!("/t/{tenant}/segments/{}/delete", s.name)),
            ]
        })
        .collect();
    let mut page = table_page(
        format!("{tenant} — {}", t(l, Msg::Segments)),
        vec![
            tx(Msg::Name),
            tx(Msg::Kind),
            "CIDR".into(),
            "MTU".into(),
            "VNI".into(),
            "NICs".into(),
            tx(Msg::Ingress),
            tx(Msg::Egress),
            String::new(),
        ],
        rows,
        empty,
        page,
        tx(Msg::Create),
        vec![
            kumo_web_portal::listing::name_field(l),
            Field::new(
                "kind",
                t(l, Msg::Kind),
                Input::Select(vec![
                    ("ethernet".into(), "Ethernet".into()),
                    ("roce".into(), "RoCE".into()),
                ]),
            )
            .help(help(l, "kind")),
            Field::new("cidr", "CIDR", Input::Text)
                .required()
                .placeholder("10.0.0.0/24")
                .help(help(l, "cidr")),
            Field::new("mtu", "MTU", Input::NUMBER).help(help(l, "mtu")),
            Field::new("ingress", t(l, Msg::Ingress), Input::TextArea)
                .placeholder("tcp:22:0.0.0.0/0")
                .help(help(l, "ingress")),
        ],
    );
    page.sections.extend(public_ways_in(v, tenant).await?);
    Ok(page)
}

/// The project's public addresses and port forwards: how its segments
/// are reached from outside.
async fn public_ways_in(v: &Visit, tenant: &str) -> Result<[Section; 2], ApiError> {
    let l = v.lang;
    let tx = |m| t(l, m).to_owned();
    let nic = |n: &api::NicRef| format!("{} ({} on {})", n.vm, n.ip, n.segment);
    let ips = crate::app::public_net::list(&v.st, &v.ctx, tenant, &first_page())
        .await?
        .items;
    let forwards = crate::app::public_net::list_forwards(&v.st, &v.ctx, tenant, &first_page())
        .await?
        .items;
    Ok([
        Section {
            heading: tx(Msg::PublicIps),
            columns: vec![tx(Msg::Address), tx(Msg::Pool), tx(Msg::AttachedTo)],
            rows: ips
                .iter()
                .map(|ip| {
                    vec![
                        Cell::Code(ip.address.clone()),
                        Cell::text(&ip.pool),
                        Cell::text(ip.attached.as_ref().map(nic).unwrap_or_else(|| "-".into())),
                    ]
                })
                .collect(),
            empty: tx(Msg::PublicIpsEmpty),
            ..Default::default()
        },
        Section {
            heading: tx(Msg::PortForwards),
            columns: vec![tx(Msg::Address), tx(Msg::ForwardTo)],
            rows: forwards
                .iter()
                .map(|f| {
                    vec![
                        Cell::Code(format!(
                            "{}:{}/{}",
                            f.public_ip,
                            f.public_port,
                            f.protocol.as_str()
                        )),
                        Cell::text(format!("{}:{}", nic(&f.to), f.private_port)),
                    ]
                })
                .collect(),
            empty: tx(Msg::PortForwardsEmpty),
            ..Default::default()
        },
    ])
}
/// A project's volumes: each with its state, host, VM and where the guest
/// finds it; made, attached, detached and deleted here.
async fn volumes_listing(v: &Visit, page: &Page, tenant: &str) -> Result<Listing, ApiError> {
    let l = v.lang;
    let tx = |m| t(l, m).to_owned();
    let items = crate::app::volumes::list(&v.st, &v.ctx, tenant, &first_page())
        .await?
        .items;
    // Both forms (create, attach) choose among the project's VMs.
    let vms = vm_choice(v, tenant).await?;
    let rows = items
        .iter()
        .map(|vol| {
            let detach = match &vol.vm {
                Some(_) => Cell::Button {
                    action: format!("/t/{tenant}/volumes/{}/detach", vol.name),
                    label: word(l, "detach"),
                },
                None => Cell::text(""),
            };
            vec![
                Cell::text(&vol.name),
                Cell::text(format!("{} GiB", vol.size_gib)),
                Cell::State {
                    word: vol.state.as_str().into(),
                    label: {
                        let state = match &vol.moving_to {
                            Some(h) => format!("{} → {h}", word(l, vol.state.as_str())),
                            None => word(l, vol.state.as_str()),
                        };
                        match &vol.reason {
                            Some(r) => format!("{state} ({r})"),
                            None => state,
                        }
                    },
                },
                Cell::text(vol.host.as_deref().unwrap_or("-")),
                Cell::text(vol.vm.as_deref().unwrap_or("-")),
                Cell::Code(vol.guest_path()),
                detach,
                delete_button(l, format!("/t/{tenant}/volumes/{}/delete", vol.name)),
            ]
        })
        .collect();
    let mut listing = table_page(
        format!("{tenant} — {}", t(l, Msg::Volumes)),
        vec![
            tx(Msg::Name),
            tx(Msg::SizeGib),
            tx(Msg::State),
            tx(Msg::Host),
            "VM".into(),
            tx(Msg::InGuest),
            String::new(),
            String::new(),
        ],
        rows,
        tx(Msg::VolumesEmpty),
        page,
        tx(Msg::Create),
        vec![
            kumo_web_portal::listing::name_field(l),
            Field::new("size_gib", t(l, Msg::SizeGib), Input::NUMBER)
                .required()
                .help(help(l, "size_gib")),
            Field::new("vm", "VM", vms.clone()).help(help(l, "volume_vm")),
        ],
    );
    let detached: Vec<(String, String)> = items
        .iter()
        .filter(|vol| vol.vm.is_none())
        .map(|vol| (vol.name.clone(), vol.name.clone()))
        .collect();
    if !detached.is_empty() {
        listing.sections.push(Section {
            heading: tx(Msg::AttachVolume),
            form: Some(Form {
                action: page.href(),
                submit: tx(Msg::Attach),
                fields: vec![
                    Field::new("attach", t(l, Msg::Volumes), Input::Select(detached))
                        .help(help(l, "attach")),
                    Field::new("vm", "VM", vms)
                        .required()
                        .help(help(l, "attach_vm")),
                ],
            }),
            ..Default::default()
        });
    }
    Ok(listing)
}

/// Bytes as the page shows them: MiB under a GiB, else GiB with one
/// decimal.
fn bytes_shown(bytes: u64) -> String {
    if bytes < 1 << 30 {
        format!("{} MiB", bytes.div_ceil(1 << 20))
    } else {
        format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
    }
}

/// A project's shares: each with its size, what is written in it, its
/// state, and the VMs that mount it where; made, grown and deleted here.
async fn shares_listing(v: &Visit, page: &Page, tenant: &str) -> Result<Listing, ApiError> {
    let l = v.lang;
    let tx = |m| t(l, m).to_owned();
    let items = crate::app::shares::list(&v.st, &v.ctx, tenant, &first_page())
        .await?
        .items;
    let rows = items
        .iter()
        .map(|s| {
            let mounts = s
                .mounts
                .iter()
                .map(|m| {
                    let ro = if m.read_only {
                        format!(" ({})", word(l, "read-only"))
                    } else {
                        String::new()
                    };
                    format!("{} → {}{ro}", m.vm, m.path)
                })
                .collect::<Vec<_>>()
                .join("\n");
            vec![
                Cell::text(&s.name),
                Cell::text(format!("{} GiB", s.size_gib)),
                Cell::text(s.used_bytes.map_or_else(|| "-".to_owned(), bytes_shown)),
                Cell::State {
                    word: s.state.as_str().into(),
                    label: match &s.reason {
                        Some(r) => format!("{} ({r})", word(l, s.state.as_str())),
                        None => word(l, s.state.as_str()),
                    },
                },
                Cell::text(if s.read_only {
                    word(l, "over-size")
                } else {
                    "-".to_owned()
                }),
                if mounts.is_empty() {
                    Cell::text("-")
                } else {
                    Cell::Code(mounts)
                },
                delete_button(l, format!("/t/{tenant}/shares/{}/delete", s.name)),
            ]
        })
        .collect();
    let mut listing = table_page(
        format!("{tenant} — {}", t(l, Msg::Shares)),
        vec![
            tx(Msg::Name),
            tx(Msg::SizeGib),
            tx(Msg::Used),
            tx(Msg::State),
            tx(Msg::ReadOnly),
            tx(Msg::MountedIn),
            String::new(),
        ],
        rows,
        tx(Msg::SharesEmpty),
        page,
        tx(Msg::Create),
        vec![
            kumo_web_portal::listing::name_field(l),
            Field::new("size_gib", t(l, Msg::SizeGib), Input::NUMBER)
                .required()
                .help(help(l, "share_size_gib")),
        ],
    );
    // Only an available share grows.
    let available: Vec<(String, String)> = items
        .iter()
        .filter(|s| s.state == api::ShareState::Available)
        .map(|s| (s.name.clone(), format!("{} ({} GiB)", s.name, s.size_gib)))
        .collect();
    if !available.is_empty() {
        listing.sections.push(Section {
            heading: tx(Msg::GrowShare),
            form: Some(Form {
                action: page.href(),
                submit: tx(Msg::Grow),
                fields: vec![
                    Field::new("grow", t(l, Msg::Share), Input::Select(available))
                        .help(help(l, "grow")),
                    Field::new("size_gib", t(l, Msg::SizeGib), Input::NUMBER)
                        .required()
                        .help(help(l, "grow_size_gib")),
                ],
            }),
            ..Default::default()
        });
    }
    Ok(listing)
}

async fn members_listing(v: &Visit, page: &Page, tenant: &str) -> Result<Listing, ApiError> {
    let l = v.lang;
    let empty = t(l, Msg::Empty).to_owned();
    let tx = |m| t(l, m).to_owned();
    let items = crate::app::members::list(&v.st, &v.ctx, tenant, &first_page())
        .await?
        .items;
    let rows = items
        .iter()
        .map(|m| {
            vec![
                Cell::text(&m.user),
                Cell::text(word(l, m.role.as_str())),
                Cell::text(when(m.since)),
                Cell::Button {
                    action: format!("/t/{tenant}/members/{}/remove", m.user),
                    label: tx(Msg::Remove),
                },
            ]
        })
        .collect();
    let roles = ["member", "viewer", "owner"]
        .iter()
        .map(|r| (r.to_string(), word(l, r)))
        .collect();
    Ok(table_page(
        format!("{tenant} — {}", t(l, Msg::Members)),
        vec![
            tx(Msg::User),
            tx(Msg::Role),
            tx(Msg::Created),
            String::new(),
        ],
        rows,
        empty,
        page,
        tx(Msg::AddMember),
        vec![
            Field::new("user", t(l, Msg::User), Input::Text)
                .required()
                .help(help(l, "user")),
            Field::new("role", t(l, Msg::Role), Input::Select(roles)).help(help(l, "role")),
        ],
    ))
}

async fn tokens_listing(v: &Visit, page: &Page) -> Result<Listing, ApiError> {
    let l = v.lang;
    let empty = t(l, Msg::Empty).to_owned();
    let tx = |m| t(l, m).to_owned();
    let items = crate::app::tokens::list(&v.st, &v.ctx, &first_page())
        .await?
        .items;
    let rows = items
        .iter()
        .map(|k| {
            vec![
                Cell::text(&k.description),
                Cell::text(when(k.created_at)),
                Cell::text(k.expires_at.map(when).unwrap_or_else(|| "-".into())),
                Cell::text(k.last_used_at.map(when).unwrap_or_else(|| "-".into())),
                Cell::Button {
                    action: format!("/tokens/{}/revoke", k.id),
                    label: tx(Msg::Revoke),
                },
            ]
        })
        .collect();
    Ok(table_page(
        tx(Msg::Tokens),
        vec![
            tx(Msg::Description),
            tx(Msg::Created),
            tx(Msg::Expires),
            tx(Msg::LastUsed),
            String::new(),
        ],
        rows,
        empty,
        page,
        tx(Msg::Create),
        vec![
            Field::new("description", t(l, Msg::Description), Input::Text)
                .required()
                .help(help(l, "token_description")),
            Field::new("days", t(l, Msg::Expires), Input::NUMBER)
                .placeholder("90")
                .answers(&["expires_at"])
                .help(help(l, "days")),
        ],
    ))
}

async fn hosts_listing(v: &Visit) -> Result<Listing, ApiError> {
    let l = v.lang;
    let empty = t(l, Msg::Empty).to_owned();
    let tx = |m| t(l, m).to_owned();
    let items = crate::app::fleet::list(&v.st, &v.ctx, &first_page())
        .await?
        .items;
    let rows = items
        .iter()
        .map(|h| {
            vec![
                Cell::Link {
                    href: format!("/admin/hosts/{}", h.name),
                    text: h.name.clone(),
                },
                Cell::State {
                    word: h.state.as_str().into(),
                    label: h.state.as_str().into(),
                },
                Cell::text(h.gpu_models.join(", ")),
                Cell::text(format!("{} / {}", h.gpus - h.gpus_free.min(h.gpus), h.gpus)),
                Cell::text(h.rdma_nics.to_string()),
                Cell::text(h.scalable_unit.clone().unwrap_or_default()),
                Cell::text(when(h.last_heartbeat_at)),
            ]
        })
        .collect();
    let heat: Vec<(String, u32, u32)> = items
        .iter()
        .filter(|h| h.gpus > 0)
        .map(|h| (h.name.clone(), h.gpus - h.gpus_free.min(h.gpus), h.gpus))
        .collect();
    Ok(Listing {
        heading: tx(Msg::Hosts),
        sections: vec![
            Section {
                heading: tx(Msg::GpuUse),
                svg: Some(heatmap_svg(&heat)),
                ..Default::default()
            },
            Section {
                heading: String::new(),
                columns: vec![
                    tx(Msg::Name),
                    tx(Msg::State),
                    "GPU".into(),
                    tx(Msg::Gpus),
                    "RDMA".into(),
                    "SU".into(),
                    tx(Msg::Heartbeat),
                ],
                rows,
                empty,
                ..Default::default()
            },
        ],
        ..Default::default()
    })
}

async fn host_listing(v: &Visit, name: &str) -> Result<Listing, ApiError> {
    let l = v.lang;
    let empty = t(l, Msg::Empty).to_owned();
    let tx = |m| t(l, m).to_owned();
    let h = crate::app::fleet::show(&v.st, &v.ctx, name).await?;
    // One row per VM: its GPUs and NICs by address, its CPUs counted.
    let mut per_vm: std::collections::BTreeMap<uuid::Uuid, (Vec<&str>, Vec<&str>, usize)> =
        Default::default();
    for a in &h.allocations {
        let e = per_vm.entry(a.vm_id).or_default();
        match a.kind.as_str() {
            "gpu" => e.0.push(&a.key),
            "nic" => e.1.push(&a.key),
            _ => e.2 += 1,
        }
    }
    let names = crate::store::vms::names_by_id(&v.st.db, per_vm.keys().copied()).await?;
    let allocations = per_vm
        .into_iter()
        .map(|(vm, (gpus, nics, cpus))| {
            vec![
                Cell::text(names.get(&vm).cloned().unwrap_or_else(|| vm.to_string())),
                Cell::Code(gpus.join(" ")),
                Cell::Code(nics.join(" ")),
                Cell::text(cpus.to_string()),
            ]
        })
        .collect();
    let fabric = h
        .fabric
        .iter()
        .map(|p| {
            vec![
                Cell::text(&p.netdev),
                Cell::text(format!("{:?}", p.qos)),
                Cell::text(format!("{:?}", p.vfs)),
            ]
        })
        .collect();
    let heat = [(
        h.host.name.clone(),
        h.host.gpus - h.host.gpus_free.min(h.host.gpus),
        h.host.gpus,
    )];
    Ok(Listing {
        heading: format!("{} — {}", tx(Msg::Hosts), h.host.name),
        sections: vec![
            Section {
                heading: tx(Msg::GpuUse),
                svg: Some(heatmap_svg(&heat)),
                ..Default::default()
            },
            Section {
                heading: tx(Msg::Matrix),
                pre: Some(h.matrix.clone()),
                ..Default::default()
            },
            Section {
                heading: tx(Msg::Allocations),
                columns: vec!["VM".into(), "GPU".into(), "NIC".into(), "vCPU".into()],
                rows: allocations,
                empty: empty.clone(),
                ..Default::default()
            },
            Section {
                heading: tx(Msg::Passthrough),
                columns: vec![tx(Msg::PassthroughProblem)],
                rows: h
                    .host
                    .passthrough_problems
                    .iter()
                    .map(|p| vec![Cell::text(p)])
                    .collect(),
                empty: kumo_web_portal::i18n::passthrough_ready(
                    l,
                    h.host.hugepages_free_bytes >> 30,
                ),
                ..Default::default()
            },
            Section {
                heading: tx(Msg::NvSwitchPartitions),
                columns: vec!["ID".into(), "GPU".into()],
                rows: h
                    .host
                    .fabric_manager_problem
                    .iter()
                    .map(|p| vec![Cell::text("—"), Cell::text(p)])
                    .chain(
                        h.host.partitions.iter().map(|p| {
                            vec![Cell::text(p.id.to_string()), Cell::Code(p.gpus.join(" "))]
                        }),
                    )
                    .collect(),
                empty: tx(Msg::NoNvSwitchPartitions),
                ..Default::default()
            },
            Section {
                heading: tx(Msg::Fabric),
                columns: vec!["netdev".into(), "QoS".into(), "VF".into()],
                rows: fabric,
                empty,
                ..Default::default()
            },
        ],
        ..Default::default()
    })
}

async fn tenants_listing(v: &Visit, page: &Page) -> Result<Listing, ApiError> {
    let l = v.lang;
    let empty = t(l, Msg::Empty).to_owned();
    let tx = |m| t(l, m).to_owned();
    // Everyone may list their own projects; this page is the admin's.
    crate::app::access::require_admin(&v.ctx.caller, "managing projects")?;
    let items = crate::app::tenants::list(&v.st, &v.ctx, &first_page())
        .await?
        .items;
    let rows = items
        .iter()
        .map(|tn| {
            vec![
                Cell::Link {
                    href: format!("/t/{}/vms", tn.name),
                    text: tn.name.clone(),
                },
                Cell::text(&tn.display_name),
                Cell::text(&tn.description),
                Cell::text(when(tn.created_at)),
            ]
        })
        .collect();
    Ok(table_page(
        tx(Msg::Tenants),
        vec![
            tx(Msg::Name),
            tx(Msg::DisplayName),
            tx(Msg::Description),
            tx(Msg::Created),
        ],
        rows,
        empty,
        page,
        tx(Msg::Create),
        vec![
            kumo_web_portal::listing::name_field(l),
            Field::new("display_name", t(l, Msg::DisplayName), Input::Text)
                .help(help(l, "display_name")),
            Field::new("description", t(l, Msg::Description), Input::Text)
                .help(help(l, "tenant_description")),
        ],
    ))
}

async fn rates_listing(v: &Visit, page: &Page) -> Result<Listing, ApiError> {
    let l = v.lang;
    let empty = t(l, Msg::Empty).to_owned();
    let tx = |m| t(l, m).to_owned();
    // Only administrators manage rates; everyone may read them.
    crate::app::access::require_admin(&v.ctx.caller, "managing rates")?;
    let rates = crate::app::billing::rates(&v.st, &v.ctx).await?;
    let currency = &rates.currency;
    let rows = rates
        .cards
        .iter()
        .rev()
        .flat_map(|c| {
            c.prices.iter().map(move |(class, p)| {
                vec![
                    Cell::text(when(c.effective_from)),
                    Cell::Code(class.clone()),
                    Cell::text(format!("{} {currency}", p.guaranteed)),
                    Cell::text(format!("{} {currency}", p.spot)),
                ]
            })
        })
        .collect();
    Ok(table_page(
        tx(Msg::Rates),
        vec![
            tx(Msg::EffectiveFrom),
            tx(Msg::Class),
            tx(Msg::Guaranteed),
            tx(Msg::Spot),
        ],
        rows,
        empty,
        page,
        tx(Msg::SetRate),
        vec![
            Field::new("class", t(l, Msg::Class), Input::Text)
                .required()
                .placeholder("gpu:H100-SXM5-80GB")
                .help(help(l, "class")),
            Field::new("guaranteed", t(l, Msg::Guaranteed), Input::Text)
                .required()
                .help(help(l, "rate")),
            Field::new("spot", t(l, Msg::Spot), Input::Text)
                .required()
                .help(help(l, "rate")),
        ],
    ))
}

async fn join_tokens_listing(v: &Visit, page: &Page) -> Result<Listing, ApiError> {
    let l = v.lang;
    let tx = |m| t(l, m).to_owned();
    let items = crate::app::hosts::list_join_tokens(&v.st, &v.ctx, &first_page())
        .await?
        .items;
    let rows = items
        .iter()
        .map(|k| {
            let state = if k.revoked_at.is_some() {
                word(l, "revoked")
            } else if k.used >= k.uses {
                word(l, "used")
            } else if k.expires_at <= v.ctx.at {
                word(l, "expired")
            } else {
                word(l, "valid")
            };
            vec![
                Cell::text(if k.description.is_empty() {
                    k.id.to_string()
                } else {
                    k.description.clone()
                }),
                Cell::text(when(k.created_at)),
                Cell::text(when(k.expires_at)),
                Cell::text(format!("{} / {}", k.used, k.uses)),
                Cell::text(state),
                if k.revoked_at.is_none() {
                    Cell::Button {
                        action: format!("/admin/join-tokens/{}/revoke", k.id),
                        label: tx(Msg::Revoke),
                    }
                } else {
                    Cell::text("")
                },
            ]
        })
        .collect();
    Ok(table_page(
        tx(Msg::JoinTokens),
        vec![
            tx(Msg::Description),
            tx(Msg::Created),
            tx(Msg::Expires),
            word(l, "uses"),
            tx(Msg::State),
            String::new(),
        ],
        rows,
        t(l, Msg::Empty).to_owned(),
        page,
        tx(Msg::Create),
        vec![
            Field::new("description", t(l, Msg::Description), Input::Text)
                .help(help(l, "join_description")),
            Field::new("ttl", t(l, Msg::ValidFor), Input::NUMBER)
                .placeholder("86400")
                .answers(&["ttl_seconds"])
                .help(help(l, "ttl")),
            Field::new("uses", &word(l, "uses"), Input::NUMBER)
                .placeholder("1")
                .help(help(l, "uses")),
        ],
    ))
}

async fn visit(
    st: &AppState,
    b: &Browser,
    page: &Page,
) -> Result<Result<Visit, Response>, ApiError> {
    Ok(match signed_in(st, &b.headers, &page.href()).await? {
        Ok((viewer, user)) => Ok(Visit {
            st: st.clone(),
            lang: lang(&b.headers),
            viewer,
            ctx: ctx_of(&user, b.origin.clone()),
        }),
        Err(r) => Err(r),
    })
}

fn render(v: &Visit, page: &Page, l: &Listing) -> Response {
    html(kumo_web_portal::listing_page(
        v.lang,
        &v.viewer,
        page.tenant(),
        l,
    ))
}

async fn show(st: &AppState, b: &Browser, page: Page) -> Result<Response, ApiError> {
    let v = match visit(st, b, &page).await? {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let l = listing(&v, &page).await?;
    Ok(render(&v, &page, &l))
}

/// A form's outcome: back to the page (303) when done, the page with a
/// secret shown once, or the page with the API's refusal and its status —
/// the posted form filled in as it was sent, each error in its field's
/// row (on `before`, the page as it was, when it was read: a refusal
/// changed nothing). A foreign or missing tenant stays a 404 whatever the
/// form said.
async fn answer(
    v: &Visit,
    page: &Page,
    action: &str,
    submitted: &Fields,
    before: Option<Listing>,
    outcome: Result<Option<String>, ApiError>,
) -> Result<Response, ApiError> {
    match outcome {
        Ok(None) => Ok((StatusCode::SEE_OTHER, [(LOCATION, page.href())]).into_response()),
        Ok(Some(secret)) => {
            let mut l = listing(v, page).await?;
            l.notice = Some(format!("{secret} — {}", t(v.lang, Msg::ShownOnce)));
            Ok(render(v, page, &l))
        }
        Err(e @ ApiError::NotFound(_)) => Err(e),
        Err(e) => {
            let mut l = match before {
                Some(l) => l,
                None => listing(v, page).await?,
            };
            l.refused(v.lang, action, &super::refusal(&e, submitted));
            let mut r = render(v, page, &l);
            *r.status_mut() = e.status();
            Ok(r)
        }
    }
}

/// What a form asks for, done through the API as the session's user.
async fn act(v: &Visit, page: &Page, op: Op, f: &Fields) -> Result<Option<String>, ApiError> {
    let need = |k: &str| text(f, k).ok_or_else(|| ApiError::field(k, "required"));
    match (page, op) {
        (Page::Clusters(tn), Op::Create) => {
            let shares = super::share_mounts(f)?;
            super::known_shares(&v.st, &v.ctx, tn, &shares).await?;
            let body = api::ClusterCreate {
                name: need("name")?,
                size: number(f, "size")?.unwrap_or(0),
                gpus: number(f, "gpus")?.unwrap_or(0),
                gpu_model: None,
                vcpus: None,
                memory_gib: None,
                disk_gib: None,
                template: None,
                service_level: if f.contains_key("spot") {
                    api::ServiceLevel::Spot
                } else {
                    api::ServiceLevel::Guaranteed
                },
                ssh_keys: vec![],
                networks: text(f, "network").into_iter().collect(),
                shares,
                auto_repair: f.contains_key("auto_repair"),
                repair_delay_seconds: None,
                spares: number(f, "spares")?.unwrap_or(0),
                single_su: Default::default(),
                queue: f.contains_key("queue"),
                reservation: text(f, "reservation"),
            };
            crate::app::clusters::create(&v.st, &v.ctx, tn, &body).await?;
        }
        (Page::Volumes(tn), Op::Create) => match text(f, "attach") {
            // The attach form names a volume; the create form a new name.
            Some(volume) => {
                let body = api::VolumeAttach { vm: need("vm")? };
                crate::app::volumes::attach(&v.st, &v.ctx, tn, &volume, &body).await?;
            }
            None => {
                let body = api::VolumeCreate {
                    name: need("name")?,
                    size_gib: number(f, "size_gib")?.unwrap_or(0),
                    vm: text(f, "vm"),
                    from_snapshot: None,
                };
                crate::app::volumes::create(&v.st, &v.ctx, tn, &body).await?;
            }
        },
        (Page::Volumes(tn), Op::Delete(vol)) => {
            crate::app::volumes::delete(&v.st, &v.ctx, tn, &vol).await?;
        }
        (Page::Volumes(tn), Op::Detach(vol)) => {
            crate::app::volumes::detach(&v.st, &v.ctx, tn, &vol).await?;
        }
        (Page::Shares(tn), Op::Create) => match text(f, "grow") {
            // The grow form names a share; the create form a new name.
            Some(share) => {
                let body = api::ShareGrow {
                    size_gib: number(f, "size_gib")?.unwrap_or(0),
                };
                crate::app::shares::grow(&v.st, &v.ctx, tn, &share, &body).await?;
            }
            None => {
                let body = api::ShareCreate {
                    name: need("name")?,
                    size_gib: number(f, "size_gib")?.unwrap_or(0),
                };
                crate::app::shares::create(&v.st, &v.ctx, tn, &body).await?;
            }
        },
        (Page::Shares(tn), Op::Delete(share)) => {
            crate::app::shares::delete(&v.st, &v.ctx, tn, &share).await?;
        }
        (Page::Clusters(tn), Op::Delete(c)) => {
            crate::app::clusters::delete(&v.st, &v.ctx, tn, &c).await?;
        }
        (Page::Clusters(tn), Op::Repair(c)) => {
            crate::app::cluster_repair::repair(&v.st, &v.ctx, tn, &c).await?;
        }
        (Page::Segments(tn), Op::Create) => {
            let kind = match text(f, "kind").as_deref() {
                None | Some("ethernet") => api::SegmentKind::Ethernet,
                Some("roce") => api::SegmentKind::Roce,
                Some(_) => return Err(ApiError::field("kind", "ethernet or roce")),
            };
            let ingress = text(f, "ingress")
                .unwrap_or_default()
                .split_whitespace()
                .map(|r| r.parse().map_err(|e: String| ApiError::field("ingress", e)))
                .collect::<Result<Vec<_>, _>>()?;
            let body = api::SegmentCreate {
                name: need("name")?,
                kind,
                cidr: need("cidr")?,
                gateway: None,
                mtu: number(f, "mtu")?,
                ingress,
                egress: Some(text(f, "egress").is_none_or(|e| e != "off")),
            };
            crate::app::segments::create(&v.st, &v.ctx, tn, &body).await?;
        }
        (Page::Segments(tn), Op::Delete(s)) => {
            crate::app::segments::delete(&v.st, &v.ctx, tn, &s).await?;
        }
        (Page::Members(tn), Op::Create) => {
            let role = serde_json::from_value(serde_json::Value::String(
                text(f, "role").unwrap_or_else(|| "member".into()),
            ))
            .map_err(|_| ApiError::field("role", "owner, member or viewer"))?;
            let body = api::MemberPut { role };
            crate::app::members::put(&v.st, &v.ctx, tn, &need("user")?, &body).await?;
        }
        (Page::Members(tn), Op::Delete(u)) => {
            crate::app::members::remove(&v.st, &v.ctx, tn, &u).await?;
        }
        (Page::Tokens, Op::Create) => {
            let days: i64 = number(f, "days")?.unwrap_or(90);
            if !(1..=3650).contains(&days) {
                return Err(ApiError::field("days", "1 to 3650"));
            }
            let body = api::TokenCreate {
                description: text(f, "description"),
                expires_at: Some(v.ctx.at + chrono::Duration::days(days)),
            };
            let user = v.ctx.caller.user.clone();
            let made = crate::app::tokens::mint_for(&v.st, &v.ctx, &user, body).await?;
            return Ok(Some(made.token));
        }
        (Page::Tokens, Op::Delete(id)) => {
            crate::app::tokens::revoke(&v.st, &v.ctx, &id).await?;
        }
        (Page::Tenants, Op::Create) => {
            let body = api::TenantCreate {
                name: need("name")?,
                display_name: text(f, "display_name"),
                description: text(f, "description"),
            };
            crate::app::tenants::create(&v.st, &v.ctx, &body).await?;
        }
        (Page::Rates, Op::Create) => {
            // A card replaces the one in force: carry the other classes.
            let now = crate::app::billing::rates(&v.st, &v.ctx).await?;
            let mut prices = now.current.map(|c| c.prices).unwrap_or_default();
            prices.insert(
                need("class")?,
                api::ClassPrice {
                    guaranteed: need("guaranteed")?,
                    spot: need("spot")?,
                },
            );
            let body = api::RateCardPut {
                effective_from: None,
                prices,
            };
            crate::app::billing::put_rates(&v.st, &v.ctx, &body).await?;
        }
        (Page::JoinTokens, Op::Create) => {
            let body = api::JoinTokenCreate {
                description: text(f, "description"),
                ttl_seconds: number(f, "ttl")?,
                uses: number(f, "uses")?,
            };
            let made = crate::app::hosts::create_join_token(&v.st, &v.ctx, &body).await?;
            return Ok(Some(made.token));
        }
        (Page::JoinTokens, Op::Delete(id)) => {
            crate::app::hosts::revoke_join_token(&v.st, &v.ctx, &id).await?;
        }
        (p, _) => return Err(ApiError::not_found(format!("no such form on {}", p.href()))),
    }
    Ok(None)
}

enum Op {
    Create,
    Delete(String),
    Detach(String),
    Repair(String),
}

async fn post_form(
    st: &AppState,
    b: &Browser,
    page: Page,
    op: Op,
    f: Fields,
) -> Result<Response, ApiError> {
    let v = match visit(st, b, &page).await? {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    check_csrf(
        &v.viewer.csrf,
        f.get("csrf").map(String::as_str).unwrap_or(""),
    )?;
    let action = match &op {
        Op::Create => page.href(),
        // A row's button: no form fields to judge or fill in.
        Op::Delete(_) | Op::Detach(_) | Op::Repair(_) => String::new(),
    };
    // A create's page as it stands: its form names the required fields,
    // all judged at once before the API names the first.
    let before = match op {
        Op::Create => Some(listing(&v, &page).await?),
        Op::Delete(_) | Op::Detach(_) | Op::Repair(_) => None,
    };
    let outcome = match before.as_ref().and_then(|l| l.form_posted(&action, &f)) {
        Some(form) => super::missing(form, &f),
        None => Ok(()),
    };
    let outcome = match outcome {
        Ok(()) => act(&v, &page, op, &f).await,
        Err(e) => Err(e),
    };
    answer(&v, &page, &action, &f, before, outcome).await
}

fn tenant_page(kind: &str, tenant: String) -> Result<Page, ApiError> {
    Ok(match kind {
        "clusters" => Page::Clusters(tenant),
        "segments" => Page::Segments(tenant),
        "volumes" => Page::Volumes(tenant),
        "shares" => Page::Shares(tenant),
        "members" => Page::Members(tenant),
        other => return Err(ApiError::not_found(format!("page {other:?}"))),
    })
}

fn admin_page(kind: &str) -> Result<Page, ApiError> {
    Ok(match kind {
        "hosts" => Page::Hosts,
        "tenants" => Page::Tenants,
        "rates" => Page::Rates,
        "join-tokens" => Page::JoinTokens,
        other => return Err(ApiError::not_found(format!("page {other:?}"))),
    })
}

async fn tenant_get(
    State(st): State<AppState>,
    b: Browser,
    Path((tenant, kind)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    show(&st, &b, tenant_page(&kind, tenant)?).await
}

async fn tenant_post(
    State(st): State<AppState>,
    b: Browser,
    Path((tenant, kind)): Path<(String, String)>,
    axum::Form(f): axum::Form<Fields>,
) -> Result<Response, ApiError> {
    post_form(&st, &b, tenant_page(&kind, tenant)?, Op::Create, f).await
}

/// `…/{item}/delete`, `…/{item}/remove` (members) and `…/{item}/detach`
/// (volumes).
async fn tenant_item_post(
    State(st): State<AppState>,
    b: Browser,
    Path((tenant, kind, item, verb)): Path<(String, String, String, String)>,
    axum::Form(f): axum::Form<Fields>,
) -> Result<Response, ApiError> {
    let op = match verb.as_str() {
        "delete" | "remove" => Op::Delete(item),
        "detach" => Op::Detach(item),
        "repair" => Op::Repair(item),
        _ => return Err(ApiError::not_found(format!("action {verb:?}"))),
    };
    let page = tenant_page(&kind, tenant)?;
    post_form(&st, &b, page, op, f).await
}

async fn tokens_get(State(st): State<AppState>, b: Browser) -> Result<Response, ApiError> {
    show(&st, &b, Page::Tokens).await
}

async fn tokens_post(
    State(st): State<AppState>,
    b: Browser,
    axum::Form(f): axum::Form<Fields>,
) -> Result<Response, ApiError> {
    post_form(&st, &b, Page::Tokens, Op::Create, f).await
}

async fn token_revoke(
    State(st): State<AppState>,
    b: Browser,
    Path(id): Path<String>,
    axum::Form(f): axum::Form<Fields>,
) -> Result<Response, ApiError> {
    post_form(&st, &b, Page::Tokens, Op::Delete(id), f).await
}

async fn admin_get(
    State(st): State<AppState>,
    b: Browser,
    Path(kind): Path<String>,
) -> Result<Response, ApiError> {
    show(&st, &b, admin_page(&kind)?).await
}

async fn admin_post(
    State(st): State<AppState>,
    b: Browser,
    Path(kind): Path<String>,
    axum::Form(f): axum::Form<Fields>,
) -> Result<Response, ApiError> {
    post_form(&st, &b, admin_page(&kind)?, Op::Create, f).await
}

/// `/admin/{kind}/{item}/revoke`: join tokens are the one such list.
async fn admin_item_post(
    State(st): State<AppState>,
    b: Browser,
    Path((kind, item, verb)): Path<(String, String, String)>,
    axum::Form(f): axum::Form<Fields>,
) -> Result<Response, ApiError> {
    if verb != "revoke" {
        return Err(ApiError::not_found(format!("action {verb:?}")));
    }
    post_form(&st, &b, admin_page(&kind)?, Op::Delete(item), f).await
}

async fn host_get(
    State(st): State<AppState>,
    b: Browser,
    Path(host): Path<String>,
) -> Result<Response, ApiError> {
    show(&st, &b, Page::Host(host)).await
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/t/{tenant}/{kind}", get(tenant_get).post(tenant_post))
        .route("/t/{tenant}/{kind}/{item}/{verb}", post(tenant_item_post))
        .route("/tokens", get(tokens_get).post(tokens_post))
        .route("/tokens/{id}/revoke", post(token_revoke))
        .route("/admin/hosts/{host}", get(host_get))
        .route("/admin/{kind}", get(admin_get).post(admin_post))
        .route("/admin/{kind}/{item}/{verb}", post(admin_item_post))
}
