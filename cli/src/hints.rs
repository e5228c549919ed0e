//! What to do about an error: `kumo` prints the error (with the server's
//! problem details), then one `hint:` line from [`for_error`].

use std::fmt;

use clap::ArgMatches;

use crate::client::ClientError;

/// What the command line said, as far as hints need it.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// The server the command talked to (flag, environment or profile).
    pub server: Option<String>,
    /// `--tenant` (or `KUMO_TENANT`), where the command has one.
    pub tenant: Option<String>,
    /// The subcommands, e.g. `["vm", "show"]`.
    pub command: Vec<String>,
}

impl Context {
    /// The subcommands and `--tenant` of parsed arguments.
    pub fn of(matches: &ArgMatches, server: Option<String>) -> Context {
        let mut ctx = Context {
            server,
            ..Context::default()
        };
        let mut m = matches;
        while let Some((name, sub)) = m.subcommand() {
            ctx.command.push(name.to_owned());
            if let Ok(Some(t)) = sub.try_get_one::<String>("tenant") {
                ctx.tenant = Some(t.clone());
            }
            m = sub;
        }
        ctx
    }

    fn tenant(&self) -> &str {
        self.tenant.as_deref().unwrap_or("TENANT")
    }

    fn server(&self) -> &str {
        self.server.as_deref().unwrap_or("URL")
    }

    fn noun(&self) -> &str {
        self.command.first().map(String::as_str).unwrap_or_default()
    }

    fn verb(&self) -> &str {
        self.command.last().map(String::as_str).unwrap_or_default()
    }
}

/// An error that knows its own hint (`kumo vm ssh` of a VM without a
/// public address, a wait that ended in `error`, …).
#[derive(Debug)]
pub struct Hinted {
    pub message: String,
    pub hint: String,
}

impl Hinted {
    pub fn error(message: impl Into<String>, hint: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Hinted {
            message: message.into(),
            hint: hint.into(),
        })
    }
}

impl fmt::Display for Hinted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Hinted {}

/// What went wrong, as far as the hint depends on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The server answered with an error: its status, problem type
    /// (`/problems/…`, empty when it sent no problem), the problem's
    /// detail and the resource of a `quota-exceeded`.
    Answer {
        status: u16,
        kind: String,
        detail: Option<String>,
        resource: Option<String>,
    },
    /// The server could not be reached: refused (nothing listens), timed
    /// out, or another transport error.
    Unreachable { refused: bool, timed_out: bool },
    /// The server URL is not an http(s) URL.
    BadUrl,
}

impl Failure {
    /// The failure of a client error.
    pub fn of(e: &ClientError) -> Failure {
        match e {
            ClientError::Api(p) => Failure::Answer {
                status: p.status,
                kind: p.kind.clone(),
                detail: p.detail.clone(),
                resource: p.resource.clone(),
            },
            ClientError::Unexpected { status, .. } => Failure::Answer {
                status: *status,
                kind: String::new(),
                detail: None,
                resource: None,
            },
            ClientError::Transport { source, .. } => Failure::Unreachable {
                refused: source.is_connect(),
                timed_out: source.is_timeout(),
            },
            ClientError::BadUrl(_) => Failure::BadUrl,
        }
    }
}

/// The hint for an error of a command, if there is one to give.
pub fn for_error(e: &anyhow::Error, ctx: &Context) -> Option<String> {
    for cause in e.chain() {
        if let Some(h) = cause.downcast_ref::<Hinted>() {
            return Some(h.hint.clone());
        }
        if let Some(c) = cause.downcast_ref::<ClientError>() {
            return hint(&Failure::of(c), ctx);
        }
    }
    None
}

/// Where a command's things are listed, for a "not found".
fn list_command(ctx: &Context) -> Option<String> {
    let t = ctx.tenant();
    let sub = ctx.command.get(1).map(String::as_str).unwrap_or_default();
    Some(match ctx.noun() {
        "vm" => format!("kumo vm list --tenant {t}"),
        "cluster" => format!("kumo cluster list --tenant {t}"),
        "segment" => format!("kumo segment list --tenant {t}"),
        "volume" if ctx.verb().contains("snapshot") => {
            format!("kumo volume snapshots VOLUME --tenant {t}")
        }
        "volume" => format!("kumo volume list --tenant {t}"),
        "public-ip" if sub == "pool" => "kumo public-ip pool list".into(),
        "public-ip" => format!("kumo public-ip list --tenant {t}"),
        "port-forward" => format!("kumo port-forward list --tenant {t}"),
        "member" => format!("kumo member list --tenant {t}"),
        "idle" => format!("kumo idle list --tenant {t}"),
        "tenant" | "quota" | "points" | "usage" | "events" | "audit" | "statement" => {
            "kumo tenant list".into()
        }
        "user" => "kumo user list".into(),
        "token" => "kumo token list".into(),
        "host" if sub == "join-token" => "kumo host join-token list".into(),
        "host" if sub == "device" => "kumo host device list".into(),
        "host" => "kumo host list".into(),
        "template" => "kumo template list".into(),
        "rate" => "kumo rate list".into(),
        _ => return None,
    })
}

/// The hint for a failure: one line, saying what to do.
pub fn hint(f: &Failure, ctx: &Context) -> Option<String> {
    let t = ctx.tenant();
    match f {
        Failure::BadUrl => Some(
            "give the server's whole URL, e.g. kumo login --server https://kumo.example.org".into(),
        ),
        Failure::Unreachable {
            timed_out: true, ..
        } => Some(format!(
            "the server at {} did not answer in time: try again, or check it is up",
            ctx.server()
        )),
        Failure::Unreachable { .. } => Some(format!(
            "is the server running at {}? (to use another: kumo login --server URL)",
            ctx.server()
        )),
        Failure::Answer {
            status,
            kind,
            detail,
            resource,
        } => {
            let kind = kind.trim_start_matches("/problems/");
            match (*status, kind) {
                (401, _) | (_, "unauthenticated") => Some(format!(
                    "sign in again: kumo login --server {}",
                    ctx.server()
                )),
                (403, _) | (_, "forbidden") => Some(match &ctx.tenant {
                    Some(t) => format!(
                        "ask a project owner of {t} for a role that allows this \
                         (kumo member list --tenant {t} shows who they are)"
                    ),
                    None => "ask a platform administrator, or a project owner, \
                             for the right role (kumo user me shows yours)"
                        .into(),
                }),
                (_, "points-exhausted") | (402, _) => Some(format!(
                    "the project has no points left: see kumo points show --tenant {t}; \
                     a platform administrator grants more"
                )),
                (_, "quota-exceeded") => Some(format!(
                    "{}see kumo quota show --tenant {t}: free some, or ask a platform \
                     administrator to raise it (kumo quota set)",
                    resource
                        .as_deref()
                        .map(|r| format!("the {r} limit is reached; "))
                        .unwrap_or_default()
                )),
                (_, "insufficient-capacity") => Some(
                    "no host has room for it now: ask for fewer GPUs, another --gpu-model, \
                     --spot, or try again later"
                        .into(),
                ),
                (404, _) | (_, "not-found") => {
                    let tenant_missing =
                        detail.as_deref().is_some_and(|d| d.starts_with("tenant "))
                            || (ctx.verb() == "list" && ctx.tenant.is_some());
                    if tenant_missing {
                        Some("check the project's name: kumo tenant list".into())
                    } else {
                        list_command(ctx).map(|l| format!("list them: {l}"))
                    }
                }
                (400 | 422, _) | (_, "validation") => Some(if ctx.command.is_empty() {
                    "see kumo --help".into()
                } else {
                    format!("see kumo {} --help", ctx.command.join(" "))
                }),
                (409, _) => list_command(ctx)
                    .map(|l| format!("something is in the way: see its state with {l}")),
                (429, _) => Some("too many requests: wait a little and try again".into()),
                (503, _) | (_, "unavailable") => {
                    Some("the server cannot do this now: try again shortly".into())
                }
                (500.., _) => Some(
                    "the server failed: try again, or give its operators the request id above"
                        .into(),
                ),
                _ => None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(command: &[&str], tenant: Option<&str>) -> Context {
        Context {
            server: Some("http://kumo.test:8080".into()),
            tenant: tenant.map(str::to_owned),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn answer(status: u16, kind: &str) -> Failure {
        Failure::Answer {
            status,
            kind: format!("/problems/{kind}"),
            detail: None,
            resource: None,
        }
    }

    #[test]
    fn unauthenticated_signs_in_again() {
        let h = hint(
            &answer(401, "unauthenticated"),
            &ctx(&["vm", "list"], Some("lab")),
        );
        assert_eq!(
            h.as_deref(),
            Some("sign in again: kumo login --server http://kumo.test:8080")
        );
        // Without a problem body, the status alone.
        let bare = Failure::Answer {
            status: 401,
            kind: String::new(),
            detail: None,
            resource: None,
        };
        assert!(hint(&bare, &ctx(&["tenant", "list"], None))
            .unwrap()
            .contains("kumo login --server"));
    }

    #[test]
    fn forbidden_asks_an_owner() {
        let h = hint(
            &answer(403, "forbidden"),
            &ctx(&["vm", "create"], Some("lab")),
        )
        .unwrap();
        assert!(h.contains("ask a project owner of lab"), "{h}");
        let h = hint(&answer(403, "forbidden"), &ctx(&["tenant", "create"], None)).unwrap();
        assert!(h.contains("platform administrator"), "{h}");
    }

    #[test]
    fn not_found_lists_the_kind() {
        let h = hint(
            &answer(404, "not-found"),
            &ctx(&["vm", "show"], Some("lab")),
        );
        assert_eq!(h.as_deref(), Some("list them: kumo vm list --tenant lab"));
        let h = hint(
            &answer(404, "not-found"),
            &ctx(&["segment", "delete"], Some("lab")),
        );
        assert_eq!(
            h.as_deref(),
            Some("list them: kumo segment list --tenant lab")
        );
        let h = hint(
            &answer(404, "not-found"),
            &ctx(&["public-ip", "pool", "delete"], None),
        );
        assert_eq!(h.as_deref(), Some("list them: kumo public-ip pool list"));
        let h = hint(&answer(404, "not-found"), &ctx(&["host", "show"], None));
        assert_eq!(h.as_deref(), Some("list them: kumo host list"));
        // No tenant given: a placeholder.
        let h = hint(&answer(404, "not-found"), &ctx(&["vm", "show"], None));
        assert_eq!(
            h.as_deref(),
            Some("list them: kumo vm list --tenant TENANT")
        );
    }

    #[test]
    fn a_missing_tenant_lists_tenants() {
        let f = Failure::Answer {
            status: 404,
            kind: "/problems/not-found".into(),
            detail: Some("tenant \"lba\" not found".into()),
            resource: None,
        };
        let h = hint(&f, &ctx(&["vm", "show"], Some("lba")));
        assert_eq!(
            h.as_deref(),
            Some("check the project's name: kumo tenant list")
        );
        let h = hint(
            &answer(404, "not-found"),
            &ctx(&["vm", "list"], Some("lba")),
        );
        assert_eq!(
            h.as_deref(),
            Some("check the project's name: kumo tenant list")
        );
    }

    #[test]
    fn quota_and_points_point_at_their_commands() {
        let f = Failure::Answer {
            status: 409,
            kind: "/problems/quota-exceeded".into(),
            detail: None,
            resource: Some("public_ips".into()),
        };
        let h = hint(&f, &ctx(&["public-ip", "allocate"], Some("lab"))).unwrap();
        assert!(h.starts_with("the public_ips limit is reached"), "{h}");
        assert!(h.contains("see kumo quota show --tenant lab"), "{h}");
        let h = hint(
            &answer(402, "points-exhausted"),
            &ctx(&["vm", "create"], Some("lab")),
        )
        .unwrap();
        assert!(h.contains("see kumo points show --tenant lab"), "{h}");
        let h = hint(
            &answer(409, "insufficient-capacity"),
            &ctx(&["vm", "create"], Some("lab")),
        )
        .unwrap();
        assert!(h.contains("--spot"), "{h}");
    }

    #[test]
    fn unreachable_servers_name_their_url() {
        let f = Failure::Unreachable {
            refused: true,
            timed_out: false,
        };
        assert_eq!(
            hint(&f, &ctx(&["tenant", "list"], None)).as_deref(),
            Some(
                "is the server running at http://kumo.test:8080? \
                 (to use another: kumo login --server URL)"
            )
        );
        let f = Failure::Unreachable {
            refused: false,
            timed_out: true,
        };
        assert!(hint(&f, &ctx(&[], None)).unwrap().contains("in time"));
        assert!(hint(&Failure::BadUrl, &ctx(&[], None))
            .unwrap()
            .contains("https://"));
    }

    #[test]
    fn bad_input_shows_help_and_servers_errors_the_request_id() {
        let h = hint(
            &answer(400, "validation"),
            &ctx(&["vm", "create"], Some("lab")),
        );
        assert_eq!(h.as_deref(), Some("see kumo vm create --help"));
        let h = hint(&answer(500, "internal"), &ctx(&["vm", "create"], None)).unwrap();
        assert!(h.contains("request id"), "{h}");
    }

    #[test]
    fn errors_find_their_hint_through_context() {
        let e = anyhow::Error::new(ClientError::Api(Box::new(kumo_api_types::Problem {
            kind: "/problems/not-found".into(),
            title: "Not found".into(),
            status: 404,
            detail: Some("vm \"web\" not found".into()),
            instance: None,
            request_id: None,
            errors: vec![],
            resource: None,
        })))
        .context("showing the VM");
        assert_eq!(
            for_error(&e, &ctx(&["vm", "show"], Some("lab"))).as_deref(),
            Some("list them: kumo vm list --tenant lab")
        );
        let e = Hinted::error("web has no public address", "attach one");
        assert_eq!(e.to_string(), "web has no public address");
        assert_eq!(
            for_error(&e, &ctx(&[], None)).as_deref(),
            Some("attach one")
        );
        assert_eq!(for_error(&anyhow::anyhow!("plain"), &ctx(&[], None)), None);
    }

    #[test]
    fn the_context_comes_from_the_command_line() {
        use clap::CommandFactory;
        let m = crate::commands::Cli::command()
            .try_get_matches_from(["kumo", "vm", "show", "web", "--tenant", "lab"])
            .unwrap();
        let c = Context::of(&m, Some("http://x".into()));
        assert_eq!(c.command, ["vm", "show"]);
        assert_eq!(c.tenant.as_deref(), Some("lab"));
        let m = crate::commands::Cli::command()
            .try_get_matches_from(["kumo", "public-ip", "pool", "list"])
            .unwrap();
        let c = Context::of(&m, None);
        assert_eq!(c.command, ["public-ip", "pool", "list"]);
        assert_eq!(c.tenant, None);
    }
}
