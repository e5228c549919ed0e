//! Reaching a VM with SSH from outside. `kumo vm show`'s SSH line and
//! `kumo vm ssh` both come from [`target`], so what the one prints is
//! what the other runs.

use std::fmt;

use kumo_api_types::VmNetwork;

/// Where `ssh` reaches a VM: `ssh [-p PORT] [USER@]ADDRESS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    /// The login user (the template's default user); `None`: ssh's own
    /// default, the local user name.
    pub user: Option<String>,
    /// A public address: a floating address, or a port forward's address.
    pub address: String,
    /// A port forward's public port; `None`: ssh's default, 22.
    pub port: Option<u16>,
}

impl SshTarget {
    /// ssh's arguments before any of the caller's: `[-p PORT] [USER@]ADDRESS`.
    pub fn args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(3);
        if let Some(p) = self.port {
            args.push("-p".to_owned());
            args.push(p.to_string());
        }
        args.push(match &self.user {
            Some(u) => format!("{u}@{}", self.address),
            None => self.address.clone(),
        });
        args
    }
}

/// `ssh -p 2222 ubuntu@203.0.113.10`.
impl fmt::Display for SshTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ssh {}", self.args().join(" "))
    }
}

/// How to reach a VM's SSH port from outside, if it can be: a floating
/// address of any of its NICs first (port 22 as it is), else a TCP port
/// forward to port 22. `user` is the login user, if known.
pub fn target(networks: &[VmNetwork], user: Option<&str>) -> Option<SshTarget> {
    let user = user.filter(|u| !u.is_empty()).map(str::to_owned);
    let nic = networks
        .iter()
        .find(|n| n.public_ip.is_some())
        .or_else(|| networks.iter().find(|n| n.ssh_way_in().is_some()))?;
    let (address, port) = nic.ssh_way_in()?;
    Some(SshTarget {
        user,
        address: address.to_owned(),
        port: (port != 22).then_some(port),
    })
}

/// What to do for a VM without a public address, as one line.
pub fn no_address_hint(vm: &str, tenant: &str, has_network: bool) -> String {
    if has_network {
        format!(
            "give it a public address: kumo public-ip allocate --tenant {tenant}, then \
             kumo public-ip attach ADDRESS --tenant {tenant} --vm {vm} \
             (or forward a port to 22: kumo port-forward create --tenant {tenant} \
             --public ADDRESS:2222/tcp --to {vm}:22)"
        )
    } else {
        format!(
            "it is on no segment, so no public address can reach it: create a VM with \
             --network SEGMENT (see kumo segment list --tenant {tenant})"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kumo_api_types::{ForwardProtocol, NicForward};

    fn nic(public_ip: Option<&str>, forwards: &[(u16, ForwardProtocol, u16)]) -> VmNetwork {
        VmNetwork {
            segment: "lan".into(),
            ip: "10.1.0.2".into(),
            mac: "02:6b:00:00:00:02".into(),
            public_ip: public_ip.map(str::to_owned),
            forwards: forwards
                .iter()
                .map(|&(public_port, protocol, private_port)| NicForward {
                    public_ip: "203.0.113.10".into(),
                    public_port,
                    protocol,
                    private_port,
                })
                .collect(),
        }
    }

    #[test]
    fn a_floating_address_comes_first() {
        let nets = [
            nic(None, &[(2222, ForwardProtocol::Tcp, 22)]),
            nic(Some("203.0.113.11"), &[]),
        ];
        let t = target(&nets, Some("ubuntu")).unwrap();
        assert_eq!(
            t,
            SshTarget {
                user: Some("ubuntu".into()),
                address: "203.0.113.11".into(),
                port: None
            }
        );
        assert_eq!(t.args(), ["ubuntu@203.0.113.11"]);
        assert_eq!(t.to_string(), "ssh ubuntu@203.0.113.11");
    }

    #[test]
    fn else_a_tcp_forward_to_port_22() {
        let nets = [nic(
            None,
            &[
                (8080, ForwardProtocol::Tcp, 80),
                (2200, ForwardProtocol::Udp, 22),
                (2222, ForwardProtocol::Tcp, 22),
            ],
        )];
        let t = target(&nets, Some("rocky")).unwrap();
        assert_eq!(t.args(), ["-p", "2222", "rocky@203.0.113.10"]);
        assert_eq!(t.to_string(), "ssh -p 2222 rocky@203.0.113.10");
        // Public port 22 needs no -p.
        let nets = [nic(None, &[(22, ForwardProtocol::Tcp, 22)])];
        assert_eq!(target(&nets, None).unwrap().args(), ["203.0.113.10"]);
    }

    #[test]
    fn no_user_leaves_it_to_ssh() {
        let nets = [nic(Some("203.0.113.11"), &[])];
        assert_eq!(target(&nets, None).unwrap().to_string(), "ssh 203.0.113.11");
        assert_eq!(
            target(&nets, Some("")).unwrap().to_string(),
            "ssh 203.0.113.11"
        );
    }

    #[test]
    fn nothing_public_is_no_target() {
        assert_eq!(target(&[], Some("ubuntu")), None);
        let nets = [nic(None, &[(8080, ForwardProtocol::Tcp, 80)])];
        assert_eq!(target(&nets, Some("ubuntu")), None);
        let hint = no_address_hint("web", "lab", true);
        assert!(
            hint.contains("kumo public-ip allocate --tenant lab"),
            "{hint}"
        );
        assert!(
            hint.contains("kumo public-ip attach ADDRESS --tenant lab --vm web"),
            "{hint}"
        );
        assert!(no_address_hint("web", "lab", false).contains("--network"));
    }
}
