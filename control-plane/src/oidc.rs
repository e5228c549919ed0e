//! The OpenID Providers' side of SSO that the shared state holds: each
//! provider's discovery document (with its signing keys), fetched on first
//! use, and the HTTP client that talks to providers.

use std::collections::HashMap;
use std::sync::Mutex;

use openidconnect::core::{
    CoreAuthDisplay, CoreClaimName, CoreClaimType, CoreClientAuthMethod, CoreGrantType,
    CoreJsonWebKey, CoreJweContentEncryptionAlgorithm, CoreJweKeyManagementAlgorithm,
    CoreResponseMode, CoreResponseType, CoreSubjectIdentifierType,
};
use openidconnect::{
    AdditionalProviderMetadata, DeviceAuthorizationUrl, EndSessionUrl, ProviderMetadata,
};
use serde::{Deserialize, Serialize};

/// What Kumo reads of a discovery document beyond the core: the end
/// session endpoint (RP-initiated logout) and the device authorization
/// endpoint (`kumo login --device`), where the provider has them.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Endpoints {
    pub end_session_endpoint: Option<EndSessionUrl>,
    pub device_authorization_endpoint: Option<DeviceAuthorizationUrl>,
}

impl AdditionalProviderMetadata for Endpoints {}

/// A provider's discovery document.
pub type Metadata = ProviderMetadata<
    Endpoints,
    CoreAuthDisplay,
    CoreClientAuthMethod,
    CoreClaimName,
    CoreClaimType,
    CoreGrantType,
    CoreJweContentEncryptionAlgorithm,
    CoreJweKeyManagementAlgorithm,
    CoreJsonWebKey,
    CoreResponseMode,
    CoreResponseType,
    CoreSubjectIdentifierType,
>;

/// Providers' metadata (with their signing keys), fetched on first use,
/// and the HTTP client that talks to them.
#[derive(Default)]
pub struct Sso {
    pub(crate) metadata: Mutex<HashMap<String, Metadata>>,
    pub(crate) http: std::sync::OnceLock<openidconnect::reqwest::Client>,
}
