//! The agent's side of `/agent/v1`.

use kumo_api_types::{
    AgentHeartbeat, AgentRegister, AgentRegistered, DesiredState, Problem, StatusReport,
};
use kumo_topology::HostTopology;
use reqwest::StatusCode;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the server refused the credential: {0}")]
    Unauthorized(String),
    #[error("server answered {status}: {detail}")]
    Server { status: u16, detail: String },
    #[error("cannot reach the server: {0}")]
    Transport(#[from] reqwest::Error),
}

async fn check(resp: reqwest::Response) -> Result<reqwest::Response, ClientError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp.text().await.unwrap_or_default();
    let detail = serde_json::from_str::<Problem>(&body)
        .ok()
        .and_then(|p| p.detail)
        .unwrap_or(body);
    if status == StatusCode::UNAUTHORIZED {
        return Err(ClientError::Unauthorized(detail));
    }
    Err(ClientError::Server {
        status: status.as_u16(),
        detail,
    })
}

#[derive(Clone)]
pub struct AgentClient {
    pub server: String,
    /// Shared by every clone: a credential renewed by registering again
    /// is the one every task (heartbeats, reports) uses from then on.
    credential: std::sync::Arc<std::sync::RwLock<String>>,
    http: reqwest::Client,
}

/// Registers with a join token. An agent that has a credential for this
/// server shows it: a registered host's name is re-joined only with its
/// current credential (or after an administrator's `kumo host rejoin`).
pub async fn register(
    config: &crate::run::AgentConfig,
    join_token: &str,
    current: Option<&str>,
    topology: &HostTopology,
) -> Result<AgentRegistered, ClientError> {
    let body = AgentRegister {
        join_token: join_token.to_owned(),
        name: config.name.clone(),
        topology: topology.clone(),
        virt_type: config.virt_type.clone(),
        scalable_unit: config.scalable_unit.clone(),
        rails: config.rails.clone(),
        underlay_ip: config.underlay_ip,
        edge_uplink: config.edge_uplink.clone(),
        transfer_url: config.transfer_url.clone(),
    };
    register_as(&reqwest::Client::new(), &config.server, &body, current).await
}

/// [`register`] with a registration already made up, on a given HTTP
/// client (the fleet simulator registers thousands of hosts on one).
pub async fn register_as(
    http: &reqwest::Client,
    server: &str,
    body: &AgentRegister,
    current: Option<&str>,
) -> Result<AgentRegistered, ClientError> {
    let mut req = http.post(format!(
        "{}/agent/v1/register",
        server.trim_end_matches('/')
    ));
    if let Some(c) = current {
        req = req.bearer_auth(c);
    }
    let resp = req.json(body).send().await?;
    Ok(check(resp).await?.json().await?)
}

impl AgentClient {
    fn credential(&self) -> String {
        self.credential
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every clone uses `credential` from now on.
    pub fn renew(&self, credential: &str) {
        *self.credential.write().unwrap_or_else(|e| e.into_inner()) = credential.to_owned();
    }

    pub fn new(server: &str, credential: &str) -> AgentClient {
        Self::sharing(
            reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(60))
                .build()
                .unwrap_or_default(),
            server,
            credential,
        )
    }

    /// A client on a connection pool shared with others (many simulated
    /// hosts in one process).
    pub fn sharing(http: reqwest::Client, server: &str, credential: &str) -> AgentClient {
        AgentClient {
            server: server.trim_end_matches('/').to_owned(),
            credential: std::sync::Arc::new(std::sync::RwLock::new(credential.to_owned())),
            http,
        }
    }

    pub async fn heartbeat(&self, body: &AgentHeartbeat) -> Result<(), ClientError> {
        let resp = self
            .http
            .post(format!("{}/agent/v1/heartbeat", self.server))
            .bearer_auth(self.credential())
            .json(body)
            .send()
            .await?;
        check(resp).await.map(|_| ())
    }

    /// The desired state; with `after`, waits for a newer revision.
    pub async fn desired(&self, after: Option<i64>) -> Result<DesiredState, ClientError> {
        let mut req = self
            .http
            .get(format!("{}/agent/v1/desired", self.server))
            .bearer_auth(self.credential());
        if let Some(a) = after {
            req = req.query(&[("after", a)]);
        }
        Ok(check(req.send().await?).await?.json().await?)
    }

    pub async fn telemetry(
        &self,
        report: &kumo_api_types::TelemetryReport,
    ) -> Result<(), ClientError> {
        let resp = self
            .http
            .post(format!("{}/agent/v1/telemetry", self.server))
            .bearer_auth(self.credential())
            .json(report)
            .send()
            .await?;
        check(resp).await.map(|_| ())
    }

    pub async fn status(&self, report: &StatusReport) -> Result<(), ClientError> {
        let resp = self
            .http
            .post(format!("{}/agent/v1/status", self.server))
            .bearer_auth(self.credential())
            .json(report)
            .send()
            .await?;
        check(resp).await.map(|_| ())
    }
}
