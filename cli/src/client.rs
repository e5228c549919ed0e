//! A typed client of the REST API. Errors keep the server's problem so
//! callers can branch on its `type`.

use kumo_api_types::{
    AuditEntry, Cluster, ClusterCreate, GrantCreate, Host, HostDetail, JoinTokenCreate,
    JoinTokenCreated, JoinTokenInfo, Me, Member, MemberPut, Page, PointGrant, Points, Problem,
    Quota, RateCardPut, Rates, Segment, SegmentCreate, SegmentIngress, SegmentUpdate, Statement,
    Template, TemplateCreate, Tenant, TenantCreate, TenantUpdate, TokenCreate, TokenCreated,
    TokenInfo, Usage, UsageGroup, User, UserCreate, Vm, VmCreate, VmEvent, PROBLEM_JSON,
};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{}", describe(.0))]
    Api(Box<Problem>),
    #[error("cannot reach {url}: {source}")]
    Transport { url: String, source: reqwest::Error },
    #[error("unexpected answer from the server (HTTP {status}): {body}")]
    Unexpected { status: u16, body: String },
    #[error("invalid server URL {0:?}: it must start with http:// or https://")]
    BadUrl(String),
}

fn describe(p: &Problem) -> String {
    let mut s = format!("{} (HTTP {})", p.title, p.status);
    if let Some(d) = &p.detail {
        s.push_str(": ");
        s.push_str(d);
    }
    if let Some(id) = &p.request_id {
        s.push_str(&format!(" [request {id}]"));
    }
    s
}

impl ClientError {
    /// The problem's status, for API errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api(p) => Some(p.status),
            ClientError::Unexpected { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn problem(&self) -> Option<&Problem> {
        match self {
            ClientError::Api(p) => Some(p),
            _ => None,
        }
    }
}

/// Percent-encodes one path segment so that any name the user types stays
/// one segment.
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Client {
    pub fn new(server: &str, token: Option<String>) -> Result<Client, ClientError> {
        if !(server.starts_with("http://") || server.starts_with("https://")) {
            return Err(ClientError::BadUrl(server.to_owned()));
        }
        let http = reqwest::Client::builder()
            .user_agent(concat!("kumo-cli/", env!("CARGO_PKG_VERSION")))
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|source| ClientError::Transport {
                url: server.to_owned(),
                source,
            })?;
        Ok(Client {
            base: server.trim_end_matches('/').to_owned(),
            token,
            http,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let mut req = self.http.request(method, format!("{}{}", self.base, path));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        req
    }

    async fn send_raw(&self, req: RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let resp = req.send().await.map_err(|source| ClientError::Transport {
            url: self.base.clone(),
            source,
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let is_problem = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
        let body = resp.text().await.unwrap_or_default();
        if is_problem {
            if let Ok(p) = serde_json::from_str::<Problem>(&body) {
                return Err(ClientError::Api(Box::new(p)));
            }
        }
        Err(ClientError::Unexpected {
            status: status.as_u16(),
            body,
        })
    }

    pub async fn send<T: DeserializeOwned>(&self, req: RequestBuilder) -> Result<T, ClientError> {
        let resp = self.send_raw(req).await?;
        let status = resp.status();
        let body = resp.text().await.map_err(|source| ClientError::Transport {
            url: self.base.clone(),
            source,
        })?;
        serde_json::from_str(&body).map_err(|_| ClientError::Unexpected {
            status: status.as_u16(),
            body,
        })
    }

    async fn send_empty(&self, req: RequestBuilder) -> Result<(), ClientError> {
        let resp = self.send_raw(req).await?;
        if resp.status() == StatusCode::NO_CONTENT || resp.status().is_success() {
            Ok(())
        } else {
            Err(ClientError::Unexpected {
                status: resp.status().as_u16(),
                body: String::new(),
            })
        }
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(self.request(Method::GET, path)).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.send(self.request(Method::POST, path).json(body)).await
    }

    pub async fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.send(self.request(Method::PUT, path).json(body)).await
    }

    pub async fn patch<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.send(self.request(Method::PATCH, path).json(body))
            .await
    }

    /// A DELETE that answers with a body.
    pub async fn delete_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(self.request(Method::DELETE, path)).await
    }

    pub async fn delete(&self, path: &str) -> Result<(), ClientError> {
        self.send_empty(self.request(Method::DELETE, path)).await
    }

    /// Every item of a paginated list, following `next_page_token`.
    pub async fn list_all<T: DeserializeOwned>(&self, path: &str) -> Result<Vec<T>, ClientError> {
        let mut items = Vec::new();
        let mut token: Option<String> = None;
        let sep = if path.contains('?') { '&' } else { '?' };
        loop {
            let url = match &token {
                Some(t) => format!("{path}{sep}page_token={}", segment(t)),
                None => path.to_owned(),
            };
            let page: Page<T> = self.get(&url).await?;
            items.extend(page.items);
            match page.next_page_token {
                Some(t) => token = Some(t),
                None => return Ok(items),
            }
        }
    }

    // ------------------------------------------------------------ tenants

    pub async fn create_tenant(&self, body: &TenantCreate) -> Result<Tenant, ClientError> {
        self.post("/api/v1/tenants", body).await
    }

    pub async fn list_tenants(&self) -> Result<Vec<Tenant>, ClientError> {
        self.list_all("/api/v1/tenants").await
    }

    pub async fn tenant(&self, tenant: &str) -> Result<Tenant, ClientError> {
        self.get(&format!("/api/v1/tenants/{}", segment(tenant)))
            .await
    }

    pub async fn update_tenant(
        &self,
        tenant: &str,
        body: &TenantUpdate,
    ) -> Result<Tenant, ClientError> {
        self.patch(&format!("/api/v1/tenants/{}", segment(tenant)), body)
            .await
    }

    pub async fn delete_tenant(&self, tenant: &str) -> Result<(), ClientError> {
        self.delete(&format!("/api/v1/tenants/{}", segment(tenant)))
            .await
    }

    // ------------------------------------------------------------ users

    pub async fn create_user(&self, body: &UserCreate) -> Result<User, ClientError> {
        self.post("/api/v1/users", body).await
    }

    pub async fn list_users(&self) -> Result<Vec<User>, ClientError> {
        self.list_all("/api/v1/users").await
    }

    pub async fn me(&self) -> Result<Me, ClientError> {
        self.get("/api/v1/users/me").await
    }

    // ------------------------------------------------------------ members

    pub async fn put_member(
        &self,
        tenant: &str,
        user: &str,
        body: &MemberPut,
    ) -> Result<Member, ClientError> {
        self.put(
            &format!(
                "/api/v1/tenants/{}/members/{}",
                segment(tenant),
                segment(user)
            ),
            body,
        )
        .await
    }

    pub async fn remove_member(&self, tenant: &str, user: &str) -> Result<(), ClientError> {
        self.delete(&format!(
            "/api/v1/tenants/{}/members/{}",
            segment(tenant),
            segment(user)
        ))
        .await
    }

    pub async fn list_members(&self, tenant: &str) -> Result<Vec<Member>, ClientError> {
        self.list_all(&format!("/api/v1/tenants/{}/members", segment(tenant)))
            .await
    }

    // ------------------------------------------------------------ tokens

    pub async fn create_token(&self, body: &TokenCreate) -> Result<TokenCreated, ClientError> {
        self.post("/api/v1/tokens", body).await
    }

    pub async fn create_token_for(
        &self,
        user: &str,
        body: &TokenCreate,
    ) -> Result<TokenCreated, ClientError> {
        self.post(&format!("/api/v1/users/{}/tokens", segment(user)), body)
            .await
    }

    pub async fn list_tokens(&self) -> Result<Vec<TokenInfo>, ClientError> {
        self.list_all("/api/v1/tokens").await
    }

    pub async fn revoke_token(&self, id: &str) -> Result<(), ClientError> {
        self.delete(&format!("/api/v1/tokens/{}", segment(id)))
            .await
    }

    pub async fn set_user_disabled(&self, user: &str, disabled: bool) -> Result<User, ClientError> {
        let verb = if disabled { "disable" } else { "enable" };
        self.send(self.request(
            Method::POST,
            &format!("/api/v1/users/{}/{verb}", segment(user)),
        ))
        .await
    }

    pub async fn end_sessions(&self, user: &str) -> Result<(), ClientError> {
        self.delete(&format!("/api/v1/users/{}/sessions", segment(user)))
            .await
    }

    // ------------------------------------------------------------ quota

    pub async fn quota(&self, tenant: &str) -> Result<Quota, ClientError> {
        self.get(&format!("/api/v1/tenants/{}/quota", segment(tenant)))
            .await
    }

    pub async fn set_quota(&self, tenant: &str, quota: &Quota) -> Result<Quota, ClientError> {
        self.put(&format!("/api/v1/tenants/{}/quota", segment(tenant)), quota)
            .await
    }

    // ------------------------------------------------------------ hosts

    pub async fn create_join_token(
        &self,
        body: &JoinTokenCreate,
    ) -> Result<JoinTokenCreated, ClientError> {
        self.post("/api/v1/hosts/join-tokens", body).await
    }

    pub async fn list_join_tokens(&self) -> Result<Vec<JoinTokenInfo>, ClientError> {
        self.list_all("/api/v1/hosts/join-tokens").await
    }

    pub async fn revoke_join_token(&self, id: &str) -> Result<(), ClientError> {
        self.delete(&format!("/api/v1/hosts/join-tokens/{}", segment(id)))
            .await
    }

    /// Lets a registered host join again; its credential is revoked.
    pub async fn rejoin_host(&self, host: &str) -> Result<(), ClientError> {
        self.send_empty(self.request(
            Method::POST,
            &format!("/api/v1/hosts/{}/rejoin", segment(host)),
        ))
        .await
    }

    pub async fn list_hosts(&self) -> Result<Vec<Host>, ClientError> {
        self.list_all("/api/v1/hosts").await
    }

    pub async fn host(&self, host: &str) -> Result<HostDetail, ClientError> {
        self.get(&format!("/api/v1/hosts/{}", segment(host))).await
    }

    /// `drain` or `undrain`.
    pub async fn host_action(&self, host: &str, action: &str) -> Result<Host, ClientError> {
        self.send(self.request(
            Method::POST,
            &format!("/api/v1/hosts/{}/{}", segment(host), segment(action)),
        ))
        .await
    }

    pub async fn schedule_maintenance(
        &self,
        host: &str,
        body: &kumo_api_types::MaintenanceCreate,
    ) -> Result<Host, ClientError> {
        self.post(
            &format!("/api/v1/hosts/{}/maintenance", segment(host)),
            body,
        )
        .await
    }

    pub async fn end_maintenance(&self, host: &str) -> Result<Host, ClientError> {
        self.send(self.request(
            Method::DELETE,
            &format!("/api/v1/hosts/{}/maintenance", segment(host)),
        ))
        .await
    }

    /// The fleet's devices and their health.
    pub async fn devices(
        &self,
        q: &kumo_api_types::DeviceQuery,
    ) -> Result<kumo_api_types::DeviceList, ClientError> {
        self.send(self.request(Method::GET, "/api/v1/devices").query(q))
            .await
    }

    /// `quarantine`, `repair` or `validate` a host's device.
    pub async fn device_action(
        &self,
        host: &str,
        bdf: &str,
        action: &str,
        reason: Option<String>,
    ) -> Result<kumo_api_types::Device, ClientError> {
        self.post(
            &format!(
                "/api/v1/hosts/{}/devices/{}/{}",
                segment(host),
                segment(bdf),
                segment(action)
            ),
            &kumo_api_types::DeviceAction { reason },
        )
        .await
    }

    // ------------------------------------------------------------ templates

    pub async fn create_template(&self, body: &TemplateCreate) -> Result<Template, ClientError> {
        self.post("/api/v1/templates", body).await
    }

    pub async fn list_templates(&self) -> Result<Vec<Template>, ClientError> {
        self.list_all("/api/v1/templates").await
    }

    // ------------------------------------------------------------ vms

    pub async fn create_vm(&self, tenant: &str, body: &VmCreate) -> Result<Vm, ClientError> {
        self.post(&format!("/api/v1/tenants/{}/vms", segment(tenant)), body)
            .await
    }

    pub async fn list_vms(&self, tenant: &str) -> Result<Vec<Vm>, ClientError> {
        self.list_all(&format!("/api/v1/tenants/{}/vms", segment(tenant)))
            .await
    }

    pub async fn vm(&self, tenant: &str, vm: &str) -> Result<Vm, ClientError> {
        self.get(&format!(
            "/api/v1/tenants/{}/vms/{}",
            segment(tenant),
            segment(vm)
        ))
        .await
    }

    /// `start`, `stop` or `reboot`.
    pub async fn vm_action(&self, tenant: &str, vm: &str, action: &str) -> Result<Vm, ClientError> {
        self.send(self.request(
            Method::POST,
            &format!(
                "/api/v1/tenants/{}/vms/{}/{}",
                segment(tenant),
                segment(vm),
                segment(action)
            ),
        ))
        .await
    }

    /// Unshelves a VM; `anywhere`: on any host with room, its disks
    /// moved there.
    pub async fn unshelve_vm(
        &self,
        tenant: &str,
        vm: &str,
        anywhere: bool,
    ) -> Result<Vm, ClientError> {
        self.send(self.request(
            Method::POST,
            &format!(
                "/api/v1/tenants/{}/vms/{}/unshelve?anywhere={anywhere}",
                segment(tenant),
                segment(vm),
            ),
        ))
        .await
    }

    pub async fn delete_vm(&self, tenant: &str, vm: &str) -> Result<Vm, ClientError> {
        self.send(self.request(
            Method::DELETE,
            &format!("/api/v1/tenants/{}/vms/{}", segment(tenant), segment(vm)),
        ))
        .await
    }

    // ------------------------------------------------------------- segments

    pub async fn create_segment(
        &self,
        tenant: &str,
        body: &SegmentCreate,
    ) -> Result<Segment, ClientError> {
        self.post(
            &format!("/api/v1/tenants/{}/segments", segment(tenant)),
            body,
        )
        .await
    }

    pub async fn list_segments(&self, tenant: &str) -> Result<Vec<Segment>, ClientError> {
        self.list_all(&format!("/api/v1/tenants/{}/segments", segment(tenant)))
            .await
    }

    pub async fn segment(&self, tenant: &str, name: &str) -> Result<Segment, ClientError> {
        self.get(&format!(
            "/api/v1/tenants/{}/segments/{}",
            segment(tenant),
            segment(name)
        ))
        .await
    }

    pub async fn update_segment(
        &self,
        tenant: &str,
        name: &str,
        body: &SegmentUpdate,
    ) -> Result<Segment, ClientError> {
        self.patch(
            &format!(
                "/api/v1/tenants/{}/segments/{}",
                segment(tenant),
                segment(name)
            ),
            body,
        )
        .await
    }

    pub async fn set_segment_ingress(
        &self,
        tenant: &str,
        name: &str,
        body: &SegmentIngress,
    ) -> Result<Segment, ClientError> {
        self.put(
            &format!(
                "/api/v1/tenants/{}/segments/{}/ingress",
                segment(tenant),
                segment(name)
            ),
            body,
        )
        .await
    }

    pub async fn delete_segment(&self, tenant: &str, name: &str) -> Result<(), ClientError> {
        self.delete(&format!(
            "/api/v1/tenants/{}/segments/{}",
            segment(tenant),
            segment(name)
        ))
        .await
    }

    // ------------------------------------------------------------- clusters

    pub async fn create_cluster(
        &self,
        tenant: &str,
        body: &ClusterCreate,
    ) -> Result<Cluster, ClientError> {
        self.post(
            &format!("/api/v1/tenants/{}/clusters", segment(tenant)),
            body,
        )
        .await
    }

    pub async fn list_clusters(&self, tenant: &str) -> Result<Vec<Cluster>, ClientError> {
        self.list_all(&format!("/api/v1/tenants/{}/clusters", segment(tenant)))
            .await
    }

    pub async fn cluster(&self, tenant: &str, cluster: &str) -> Result<Cluster, ClientError> {
        self.get(&format!(
            "/api/v1/tenants/{}/clusters/{}",
            segment(tenant),
            segment(cluster)
        ))
        .await
    }

    pub async fn repair_cluster(
        &self,
        tenant: &str,
        cluster: &str,
    ) -> Result<kumo_api_types::ClusterRepair, ClientError> {
        self.send(self.request(
            Method::POST,
            &format!(
                "/api/v1/tenants/{}/clusters/{}/repair",
                segment(tenant),
                segment(cluster)
            ),
        ))
        .await
    }

    pub async fn cluster_events(
        &self,
        tenant: &str,
        cluster: &str,
    ) -> Result<Vec<kumo_api_types::ClusterEvent>, ClientError> {
        let page: Page<kumo_api_types::ClusterEvent> = self
            .get(&format!(
                "/api/v1/tenants/{}/clusters/{}/events?limit=100",
                segment(tenant),
                segment(cluster)
            ))
            .await?;
        Ok(page.items)
    }

    pub async fn delete_cluster(
        &self,
        tenant: &str,
        cluster: &str,
    ) -> Result<Cluster, ClientError> {
        self.send(self.request(
            Method::DELETE,
            &format!(
                "/api/v1/tenants/{}/clusters/{}",
                segment(tenant),
                segment(cluster)
            ),
        ))
        .await
    }

    // -------------------------------------------------------------- billing

    pub async fn rates(&self) -> Result<Rates, ClientError> {
        self.get("/api/v1/rates").await
    }

    pub async fn set_rates(&self, body: &RateCardPut) -> Result<Rates, ClientError> {
        self.put("/api/v1/rates", body).await
    }

    pub async fn grant_points(
        &self,
        tenant: &str,
        body: &GrantCreate,
    ) -> Result<PointGrant, ClientError> {
        self.post(
            &format!("/api/v1/tenants/{}/points/grants", segment(tenant)),
            body,
        )
        .await
    }

    pub async fn points(&self, tenant: &str) -> Result<Points, ClientError> {
        self.get(&format!("/api/v1/tenants/{}/points", segment(tenant)))
            .await
    }

    pub async fn statement(&self, tenant: &str, month: &str) -> Result<Statement, ClientError> {
        self.get(&format!(
            "/api/v1/tenants/{}/statements/{}",
            segment(tenant),
            segment(month)
        ))
        .await
    }

    pub async fn usage(
        &self,
        tenant: &str,
        from: Option<chrono::DateTime<chrono::Utc>>,
        to: Option<chrono::DateTime<chrono::Utc>>,
        group_by: UsageGroup,
    ) -> Result<Usage, ClientError> {
        let mut q: Vec<(&str, String)> = vec![(
            "group_by",
            match group_by {
                UsageGroup::Vm => "vm",
                UsageGroup::Resource => "resource",
                UsageGroup::Day => "day",
            }
            .to_owned(),
        )];
        if let Some(f) = from {
            q.push(("from", f.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)));
        }
        if let Some(t) = to {
            q.push(("to", t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)));
        }
        self.send(
            self.request(
                Method::GET,
                &format!("/api/v1/tenants/{}/usage", segment(tenant)),
            )
            .query(&q),
        )
        .await
    }

    /// The statement as the server writes it in CSV.
    pub async fn statement_csv(&self, tenant: &str, month: &str) -> Result<String, ClientError> {
        let resp = self
            .send_raw(
                self.request(
                    Method::GET,
                    &format!(
                        "/api/v1/tenants/{}/statements/{}",
                        segment(tenant),
                        segment(month)
                    ),
                )
                .header(reqwest::header::ACCEPT, "text/csv"),
            )
            .await?;
        resp.text().await.map_err(|source| ClientError::Transport {
            url: self.base.clone(),
            source,
        })
    }

    pub async fn vm_nccl_topology(&self, tenant: &str, vm: &str) -> Result<String, ClientError> {
        let resp = self
            .send_raw(self.request(
                Method::GET,
                &format!(
                    "/api/v1/tenants/{}/vms/{}/nccl-topology",
                    segment(tenant),
                    segment(vm)
                ),
            ))
            .await?;
        resp.text().await.map_err(|source| ClientError::Transport {
            url: self.base.clone(),
            source,
        })
    }

    pub async fn events(&self, tenant: &str, limit: u32) -> Result<Vec<VmEvent>, ClientError> {
        let page: Page<VmEvent> = self
            .get(&format!(
                "/api/v1/tenants/{}/events?limit={limit}",
                segment(tenant)
            ))
            .await?;
        Ok(page.items)
    }

    // ------------------------------------------------------------ audit

    pub async fn audit(
        &self,
        tenant: Option<&str>,
        limit: u32,
    ) -> Result<Vec<AuditEntry>, ClientError> {
        let mut path = format!("/api/v1/audit?limit={limit}");
        if let Some(t) = tenant {
            path.push_str(&format!("&tenant={}", segment(t)));
        }
        let page: Page<AuditEntry> = self.get(&path).await?;
        Ok(page.items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_stay_one_segment() {
        assert_eq!(segment("proj-a"), "proj-a");
        assert_eq!(segment("../admin"), "..%2Fadmin");
        assert_eq!(segment("a b?c"), "a%20b%3Fc");
    }

    #[test]
    fn urls_must_be_http() {
        assert!(matches!(
            Client::new("localhost:8080", None),
            Err(ClientError::BadUrl(_))
        ));
        let c = Client::new("http://127.0.0.1:8080/", None).unwrap();
        assert_eq!(c.base(), "http://127.0.0.1:8080");
    }

    #[test]
    fn problems_read_well() {
        let p = Problem {
            kind: "/problems/forbidden".into(),
            title: "Not allowed".into(),
            status: 403,
            detail: Some("creating tenants is for platform administrators".into()),
            instance: None,
            request_id: Some("r1".into()),
            errors: vec![],
            resource: None,
        };
        assert_eq!(
            ClientError::Api(Box::new(p)).to_string(),
            "Not allowed (HTTP 403): creating tenants is for platform administrators [request r1]"
        );
    }
}
