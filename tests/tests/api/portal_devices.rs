//! The portal's fleet-health page (`/admin/devices`) over a real agent
//! reading a fixture host's sysfs, which the test edits (a fatal AER
//! error, a narrowed link, a RoCE counter): the page lists broken devices
//! first with why, their AER totals, links and ports' congestion, filters
//! by host and state, warns at the automatic quarantine limit, and its
//! forms (CSRF-checked) repair, validate and quarantine. Tenants' members
//! cannot see it.

use kumo_api_types::{DeviceList, DeviceState, ServiceLevel, Vm};

use crate::device_health::{aer, dev, device, hgx_agent};
use crate::harness::{csrf_of, on_both_backends, scratch, TestServer};

/// The table row of one device on the page.
fn row<'a>(page: &'a str, bdf: &str) -> &'a str {
    let start = page
        .find(&format!("<tr id=\"dev-gpu-001-{bdf}\""))
        .unwrap_or_else(|| panic!("no row for {bdf}: {page}"));
    let len = page[start..].find("</tr>").unwrap();
    &page[start..start + len]
}

async fn post(
    s: &TestServer,
    c: &reqwest::Client,
    path: &str,
    form: &[(&str, &str)],
) -> reqwest::Response {
    c.post(format!("{}{path}", s.url))
        .form(form)
        .send()
        .await
        .unwrap()
}

fn limit_of_two(c: &mut kumo_server::config::Config) {
    // hgx-h100: 8 GPUs and 8 RDMA NICs; at most two out of service by Kumo.
    c.device_health.max_quarantined_share = 0.13;
}

on_both_backends! {
    config = limit_of_two;
    async fn the_fleet_health_page_shows_broken_devices_and_acts_on_them(s: &TestServer) {
        s.tenant("lab").await;
        let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
        let dir = scratch();
        let (agent, sysfs) = hgx_agent(s, dir.path()).await;

        // Signed out: the sign-in page, coming back here.
        let anonymous = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        let r = anonymous.get(format!("{}/admin/devices?state=suspect", s.url)).send().await.unwrap();
        assert_eq!(r.status(), 303);
        assert_eq!(r.headers()["location"], "/login?next=%2Fadmin%2Fdevices%3Fstate%3Dsuspect");

        // Before any reading the page says so; the navigation links it.
        let portal = s.portal_admin().await;
        let page = s.page(&portal, "/admin/devices").await;
        assert!(page.contains("<a href=\"/admin/devices\">Fleet health</a>"), "{page}");
        assert!(page.contains("No device has reported yet."), "{page}");

        // The first reading: all healthy, every RDMA port active.
        agent.report_health().await.unwrap();
        let page = s.page(&portal, "/admin/devices").await;
        assert!(page.contains("Every device here is healthy."), "{page}");
        assert!(page.contains("Healthy (16)"), "{page}");
        assert!(page.contains("Automatic quarantine limit: 2 devices. Out of service now (quarantined, in repair or validating): 0."), "{page}");
        assert!(!page.contains("class=\"warning\""), "{page}");
        let all: DeviceList = s.admin.get("/api/v1/devices?host=gpu-001").await.unwrap();
        let nic = all.items.iter().find(|d| d.kind == "nic").unwrap();
        let rdma = nic.signals.as_ref().unwrap()["ports"][0]["device"].as_str().unwrap().to_owned();
        assert!(page.contains(&format!("<code>{rdma}/1</code>")), "{page}");
        assert_eq!(page.matches("<td>ACTIVE</td>").count(), 8, "{page}");

        // A VM on a GPU; that GPU's fatal AER error quarantines it. Another
        // GPU's link narrows; a port sends CNPs.
        let keep: Vm = s
            .admin
            .post(
                "/api/v1/tenants/lab/vms",
                &crate::device_health::vm("keep", 1, ServiceLevel::Guaranteed),
            )
            .await
            .unwrap();
        agent.sync_once(None).await.unwrap();
        let bad = keep.placement.as_ref().unwrap().gpus[0].host_bdf.clone();
        let narrow = all.items.iter().find(|d| d.kind == "gpu" && d.bdf != bad).unwrap().bdf.clone();
        let healthy = all.items.iter().rfind(|d| d.kind == "gpu" && d.bdf != bad).unwrap().bdf.clone();
        assert_ne!(narrow, healthy);
        aer(&sysfs, &bad, "aer_dev_fatal", "TOTAL_ERR_FATAL", 1);
        std::fs::write(dev(&sysfs, &narrow).join("current_link_width"), "8\n").unwrap();
        std::fs::write(sysfs.join("class/infiniband").join(&rdma).join("ports/1/hw_counters/np_cnp_sent"), "1234\n").unwrap();
        agent.report_health().await.unwrap();
        let quarantined = device(s, &bad).await;
        assert_eq!(quarantined.state, DeviceState::Quarantined);
        let reason = quarantined.reason.clone().unwrap();

        let page = s.page(&portal, "/admin/devices").await;
        assert!(page.contains("Needing attention (2)") && page.contains("Healthy (14)"), "{page}");
        // Broken first, then doubtful, then the healthy ones.
        let (at_bad, at_narrow, at_healthy) = (
            page.find(&format!("dev-gpu-001-{bad}\"")).unwrap(),
            page.find(&format!("dev-gpu-001-{narrow}\"")).unwrap(),
            page.find(&format!("dev-gpu-001-{healthy}\"")).unwrap(),
        );
        assert!(at_bad < at_narrow && at_narrow < at_healthy, "{page}");
        let r = row(&page, &bad);
        assert!(r.contains("<span class=\"state\" data-state=\"quarantined\">quarantined</span>"), "{r}");
        assert!(reason.contains("fatal") && r.contains(&reason.replace('\'', "&#39;")), "{reason:?}: {r}");
        assert!(r.contains("<td class=\"aer\">0 / 0 / <strong class=\"bad\">1</strong></td>"), "{r}");
        assert!(r.contains("<td>keep</td>"), "the VM holding it: {r}");
        assert!(r.contains("value=\"repair\">Send to repair</button>") && r.contains("value=\"validate\""), "{r}");
        assert!(!r.contains("value=\"quarantine\""), "already quarantined: {r}");
        let r = row(&page, &narrow);
        assert!(r.contains("data-state=\"suspect\">suspect</span>"), "{r}");
        assert!(r.contains("<strong class=\"bad\">x8 of x16</strong>"), "{r}");
        let r = row(&page, &healthy);
        assert!(r.contains("<td class=\"link\">x16, ") && r.contains("value=\"quarantine\">Quarantine</button>"), "{r}");
        assert!(!r.contains("value=\"repair\""), "{r}");
        assert!(page.contains("<td class=\"num\"><strong class=\"warn\">1234</strong></td>"), "the port's CNPs: {page}");
        // The same in Prometheus' series: the port's CNPs, the narrowed
        // link at half its width.
        let m = crate::device_health::fleet_metrics(s).await;
        let port = format!("{{host=\"gpu-001\",device=\"{rdma}\",port=\"1\"");
        assert_eq!(crate::device_health::series(&m, &format!("kumo_rdma_port_congestion{port},counter=\"np_cnp_sent\"}}")), Some(1234.0), "{m}");
        assert_eq!(crate::device_health::series(&m, &format!("kumo_rdma_port_active{port}}}")), Some(1.0));
        let link = format!("kumo_device_link_width_ratio{{host=\"gpu-001\",bdf=\"{narrow}\",kind=\"gpu\"}}");
        assert_eq!(crate::device_health::series(&m, &link), Some(0.5));
        assert!(page.contains("Out of service now (quarantined, in repair or validating): 1."), "{page}");

        // Filters: by state, and by host and state.
        let page = s.page(&portal, "/admin/devices?state=quarantined").await;
        assert!(page.contains(&format!("dev-gpu-001-{bad}\"")) && !page.contains(&format!("dev-gpu-001-{narrow}\"")), "{page}");
        assert!(page.contains("<option value=\"quarantined\" selected>"), "{page}");
        assert!(page.contains("action=\"/admin/devices?state=quarantined\""), "the forms keep the filter: {page}");
        let page = s.page(&portal, "/admin/devices?host=gpu-001&state=suspect").await;
        assert!(page.contains(&format!("dev-gpu-001-{narrow}\"")) && !page.contains(&format!("dev-gpu-001-{bad}\"")), "{page}");
        assert!(page.contains("<option value=\"gpu-001\" selected>"), "{page}");
        let r = portal.get(format!("{}/admin/devices?state=broken", s.url)).send().await.unwrap();
        assert_eq!(r.status(), 400);

        // In Japanese.
        let r = portal.get(format!("{}/admin/devices", s.url)).header("accept-language", "ja").send().await.unwrap();
        let ja = r.text().await.unwrap();
        assert!(ja.contains("フリートの健全性") && ja.contains("隔離中") && ja.contains("x8 (最大 x16)"), "{ja}");

        // The repair form: refused without the session's CSRF token.
        let page = s.page(&portal, "/admin/devices").await;
        let csrf = csrf_of(&page);
        for token in ["forged", ""] {
            let r = post(s, &portal, "/admin/devices", &[("csrf", token), ("host", "gpu-001"), ("bdf", &bad), ("action", "repair")]).await;
            assert_eq!(r.status(), 403, "CSRF {token:?}");
        }
        let r = post(s, &portal, "/admin/devices", &[("host", "gpu-001"), ("bdf", &bad), ("action", "repair")]).await;
        assert_eq!(r.status(), 403, "no CSRF field");
        assert_eq!(device(s, &bad).await.state, DeviceState::Quarantined);
        // With it, the device goes to repair, and the page says so.
        let r = post(s, &portal, "/admin/devices", &[("csrf", &csrf), ("host", "gpu-001"), ("bdf", &bad), ("action", "repair"), ("reason", "reseated (ticket 7)")]).await;
        assert_eq!(r.status(), 303);
        let to = r.headers()["location"].to_str().unwrap().to_owned();
        assert_eq!(to, format!("/admin/devices?done=gpu-001+{}", bad.replace(':', "%3A")));
        let d = device(s, &bad).await;
        assert_eq!(d.state, DeviceState::Repairing);
        assert_eq!(d.reason.as_deref(), Some("reseated (ticket 7)"));
        let page = s.page(&portal, &to).await;
        assert!(page.contains(&format!("<p class=\"notice\" role=\"status\">gpu-001 {bad}: now repairing.</p>")), "{page}");
        assert!(row(&page, &bad).contains("reseated (ticket 7)"));

        // A step the device's state does not allow: the page again, with why.
        let r = post(s, &portal, "/admin/devices?state=suspect", &[("csrf", &csrf), ("host", "gpu-001"), ("bdf", &healthy), ("action", "validate")]).await;
        assert_eq!(r.status(), 409);
        let page = r.text().await.unwrap();
        assert!(page.contains("role=\"alert\">gpu-001") && page.contains("cannot be validated"), "{page}");
        let r = post(s, &portal, "/admin/devices", &[("csrf", &csrf), ("host", "gpu-001"), ("bdf", "0000:99:00.0"), ("action", "repair")]).await;
        assert_eq!(r.status(), 404, "not a device of the host");

        // Quarantining a second device (from a filtered page, which the
        // answer keeps) reaches the automatic limit: the page warns.
        let r = post(s, &portal, "/admin/devices?state=suspect", &[("csrf", &csrf), ("host", "gpu-001"), ("bdf", &narrow), ("action", "quarantine")]).await;
        assert_eq!(r.status(), 303);
        assert!(r.headers()["location"].to_str().unwrap().starts_with("/admin/devices?state=suspect&done="));
        assert_eq!(device(s, &narrow).await.state, DeviceState::Quarantined);
        let page = s.page(&portal, "/admin/devices").await;
        assert!(page.contains("Out of service now (quarantined, in repair or validating): 2."), "{page}");
        assert!(page.contains("<p class=\"warning\" role=\"alert\">") && page.contains("The automatic quarantine limit is reached"), "{page}");

        // Tenants' members do not see it, nor may they post to it.
        let (_, token) = s.user("someone").await;
        s.add("lab", "someone", kumo_api_types::Role::Member).await;
        let member = s.portal_as(&token).await;
        let home = s.page(&member, "/").await;
        assert!(!home.contains("/admin/devices"), "not in a member's navigation: {home}");
        let r = member.get(format!("{}/admin/devices", s.url)).send().await.unwrap();
        assert_eq!(r.status(), 403);
        let r = post(s, &member, "/admin/devices", &[("csrf", &csrf_of(&home)), ("host", "gpu-001"), ("bdf", &healthy), ("action", "quarantine")]).await;
        assert_eq!(r.status(), 403);
        assert_eq!(device(s, &healthy).await.state, DeviceState::Healthy);
    }
}
