//! The portal's shares page (`/t/{tenant}/shares`) does what the API does:
//! in both languages it lists a project's shares with their size, use,
//! state and mounts; its forms make, grow and delete them (a refusal comes
//! back with the API's reason in its field's row); the VM and cluster
//! create forms mount one with their `share` field (`NAME[:/PATH][:ro]`),
//! a share the project lacks is that field's error, and the VM page shows
//! a VM's shares.

use kumo_api_types::{Share, ShareState, Vm};

use crate::harness::{csrf_of, TestServer};

async fn share(s: &TestServer, name: &str) -> Share {
    s.admin
        .get(&format!("/api/v1/tenants/lab/shares/{name}"))
        .await
        .unwrap()
}

/// The error shown in the form row of the field with id `id`.
fn error<'a>(page: &'a str, id: &str) -> &'a str {
    let start = page
        .find(&format!("id=\"{id}-error\""))
        .unwrap_or_else(|| panic!("no error for {id}: {page}"));
    let end = start + page[start..].find("</span>").unwrap();
    &page[start..end]
}

#[tokio::test]
async fn the_portal_shares_page_and_forms_act_through_the_api() {
    let s = TestServer::start(crate::harness::Backend::Sqlite).await;
    s.tenant("lab").await;
    let mut agent = s.sim_agent("store-001", "cpu-only").await;
    assert!(agent.heartbeat_with_shares().await.is_success());
    let portal = s.portal_admin().await;

    // Empty, in both languages, and in the project's navigation.
    let page = s.page(&portal, "/t/lab/shares").await;
    assert!(page.contains("No share yet"), "{page}");
    assert!(
        page.contains("href=\"/t/lab/shares\""),
        "in the project's navigation"
    );
    let vms = s.page(&portal, "/t/lab/vms").await;
    assert!(vms.contains("href=\"/t/lab/shares\""), "{vms}");
    let ja = async |path: &str| {
        let r = portal
            .get(format!("{}{path}", s.url))
            .header("accept-language", "ja")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        r.text().await.unwrap()
    };
    let page = ja("/t/lab/shares").await;
    assert!(
        page.contains("<html lang=\"ja\">")
            && page.contains("lab — 共有ストレージ")
            && page.contains("共有ストレージはまだありません"),
        "{page}"
    );

    let csrf = csrf_of(&page);
    let form = async |path: &str, fields: &[(&str, &str)]| {
        let mut f = vec![("csrf", csrf.as_str())];
        f.extend_from_slice(fields);
        let r = portal
            .post(format!("{}{path}", s.url))
            .form(&f)
            .send()
            .await
            .unwrap();
        let to = r
            .headers()
            .get("location")
            .map(|l| l.to_str().unwrap().to_owned());
        (r.status().as_u16(), to, r.text().await.unwrap())
    };

    // Refused: every empty required field at once, then the API's rule
    // beside its field, what was entered kept.
    let (status, _, page) = form("/t/lab/shares", &[("name", ""), ("size_gib", "")]).await;
    assert_eq!(status, 400, "{page}");
    assert!(
        page.contains("href=\"#f0-name\"") && page.contains("href=\"#f0-size_gib\""),
        "{page}"
    );
    let (status, _, page) = form("/t/lab/shares", &[("name", "datasets"), ("size_gib", "0")]).await;
    assert_eq!(status, 400, "{page}");
    assert!(
        error(&page, "f0-size_gib").contains("a share is 1 to"),
        "{page}"
    );
    assert!(page.contains("value=\"datasets\""), "kept: {page}");

    // Made through the form, then by its keeper host.
    let (status, to, page) =
        form("/t/lab/shares", &[("name", "datasets"), ("size_gib", "10")]).await;
    assert_eq!(status, 303, "{page}");
    assert_eq!(to.as_deref(), Some("/t/lab/shares"));
    assert_eq!(share(&s, "datasets").await.size_gib, 10);
    agent.converge().await;
    assert_eq!(share(&s, "datasets").await.state, ShareState::Available);
    let page = s.page(&portal, "/t/lab/shares").await;
    assert!(
        page.contains("<td>datasets</td><td>10 GiB</td><td>0 MiB</td>")
            && page.contains("data-state=\"available\""),
        "{page}"
    );
    assert!(
        page.contains("<h2>Grow a share</h2>") && page.contains("datasets (10 GiB)"),
        "the grow form offers it: {page}"
    );

    // Grown through its form; never shrunk (the API's reason in the
    // size's row of the grow form).
    let (status, _, page) = form("/t/lab/shares", &[("grow", "datasets"), ("size_gib", "5")]).await;
    assert_eq!(status, 400, "{page}");
    assert!(error(&page, "f1-size_gib").contains("only grows"), "{page}");
    let (status, _, _) = form("/t/lab/shares", &[("grow", "datasets"), ("size_gib", "20")]).await;
    assert_eq!(status, 303);
    assert_eq!(share(&s, "datasets").await.size_gib, 20);

    // The VM form mounts it; a share the project lacks, or a bad
    // spelling, is the share field's error.
    let vm = |name: &'static str, share: &'static str| {
        vec![
            ("name", name),
            ("vcpus", "1"),
            ("memory_gib", "1"),
            ("share", share),
        ]
    };
    let (status, _, page) = form("/t/lab/vms", &vm("job", "nope:/data")).await;
    assert_eq!(status, 400, "{page}");
    assert!(error(&page, "vm-share").contains("no share"), "{page}");
    assert!(page.contains("value=\"nope:/data\""), "kept: {page}");
    let (status, _, page) = form("/t/lab/vms", &vm("job", "datasets:data")).await;
    assert_eq!(status, 400, "{page}");
    assert!(
        error(&page, "vm-share").contains("NAME[:/PATH][:ro]"),
        "{page}"
    );
    let (status, to, page) = form("/t/lab/vms", &vm("job", "datasets:/data:ro")).await;
    assert_eq!(status, 303, "{page}");
    assert_eq!(to.as_deref(), Some("/t/lab/vms/job"));
    agent.converge().await;
    let job: Vm = s.admin.vm("lab", "job").await.unwrap();
    assert_eq!(job.shares.len(), 1, "{job:?}");
    assert_eq!(
        (job.shares[0].path.as_str(), job.shares[0].read_only),
        ("/data", true)
    );
    let tag = job.shares[0].tag.clone();

    // The VM page shows it, in both languages.
    let page = s.page(&portal, "/t/lab/vms/job").await;
    assert!(
        page.contains("<h2>Shares</h2>")
            && page.contains(&format!(
                "<td>datasets</td><td><code>/data</code></td><td>yes</td><td><code>{tag}</code></td>"
            )),
        "{page}"
    );
    let page = ja("/t/lab/vms/job").await;
    assert!(
        page.contains("<h2>共有ストレージ</h2>") && page.contains("<th>ゲスト内のパス</th>"),
        "{page}"
    );

    // The shares page says where it is mounted, in both languages.
    let page = s.page(&portal, "/t/lab/shares").await;
    assert!(
        page.contains("<code>job → /data (read-only)</code>"),
        "{page}"
    );
    let page = ja("/t/lab/shares").await;
    assert!(
        page.contains("<code>job → /data (読み取り専用)</code>")
            && page.contains("<th>使用量</th>")
            && page.contains("利用可能"),
        "{page}"
    );

    // The cluster form takes the field too.
    let cluster = s.page(&portal, "/t/lab/clusters").await;
    assert!(cluster.contains("name=\"share\""), "{cluster}");
    let (status, _, page) = form(
        "/t/lab/clusters",
        &[("name", "grid"), ("size", "1"), ("share", "nope")],
    )
    .await;
    assert_eq!(status, 400, "{page}");
    assert!(error(&page, "f0-share").contains("no share"), "{page}");
    let (status, _, page) = form(
        "/t/lab/clusters",
        &[("name", "grid"), ("size", "1"), ("share", "datasets")],
    )
    .await;
    assert_eq!(status, 303, "{page}");
    agent.converge().await;
    let members: Vec<Vm> = s
        .admin
        .list_all::<Vm>("/api/v1/tenants/lab/vms")
        .await
        .unwrap()
        .into_iter()
        .filter(|v| v.cluster.as_deref() == Some("grid"))
        .collect();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].shares[0].path, "/mnt/datasets");

    // Deleting a mounted share is refused with the API's reason; once no
    // VM mounts it, the form's button deletes it.
    let (status, _, page) = form("/t/lab/shares/datasets/delete", &[]).await;
    assert_eq!(status, 409, "{page}");
    assert!(page.contains("unmount it"), "{page}");
    s.admin
        .delete("/api/v1/tenants/lab/clusters/grid")
        .await
        .unwrap();
    s.admin.delete("/api/v1/tenants/lab/vms/job").await.unwrap();
    for _ in 0..3 {
        agent.converge().await;
    }
    let (status, _, page) = form("/t/lab/shares/datasets/delete", &[]).await;
    assert_eq!(status, 303, "{page}");
    assert!(matches!(
        share(&s, "datasets").await.state,
        ShareState::Deleting
    ));
    s.stop().await;
}
