//! Domains added at run time.

use starling_core::storage::{Storage, StorageError};

/// Domains added at run time: add (conflict on a second add, nothing
/// changed then), state and settings changes, listing by name, deletion;
/// every change moves the version counter and failed ones do not;
/// settings round-trip; SQL-looking names are data.
pub async fn domains(s: &Storage) {
    use starling_core::storage::{DomainSettings, DomainState, StoredDomain};
    let d = s.domains.as_ref();
    assert!(d.domains().await.unwrap().is_empty());
    let v0 = d.domains_version().await.unwrap();
    let dom = |name: &str| StoredDomain {
        name: name.to_owned(),
        state: DomainState::Enabled,
        settings: DomainSettings::default(),
        created_at: 1_800_000_000_000,
        version: 0,
    };
    d.add_domain(&dom("b.example")).await.unwrap();
    let v1 = d.domains_version().await.unwrap();
    assert!(v1 > v0, "an add moves the counter");
    let odd = "x'); DROP TABLE domains; --";
    d.add_domain(&dom(odd)).await.unwrap();
    d.add_domain(&dom("a.example")).await.unwrap();
    let v2 = d.domains_version().await.unwrap();
    assert!(matches!(
        d.add_domain(&dom("a.example")).await,
        Err(StorageError::Conflict)
    ));
    assert_eq!(
        d.domains_version().await.unwrap(),
        v2,
        "a refused add changes nothing"
    );
    let names: Vec<String> = d
        .domains()
        .await
        .unwrap()
        .into_iter()
        .map(|x| x.name)
        .collect();
    assert_eq!(names, ["a.example", "b.example", odd]);
    let a = d.domain("a.example").await.unwrap().expect("stored");
    assert_eq!(a.state, DomainState::Enabled);
    assert_eq!(a.created_at, 1_800_000_000_000);
    assert_eq!(a.version, v2);
    assert!(d.domain("nope.example").await.unwrap().is_none());

    assert!(d
        .set_domain_state("a.example", DomainState::Disabled)
        .await
        .unwrap());
    let v3 = d.domains_version().await.unwrap();
    assert!(v3 > v2);
    let a = d.domain("a.example").await.unwrap().unwrap();
    assert_eq!((a.state, a.version), (DomainState::Disabled, v3));
    assert!(!d
        .set_domain_state("nope.example", DomainState::Enabled)
        .await
        .unwrap());
    assert_eq!(d.domains_version().await.unwrap(), v3);

    let settings = DomainSettings {
        registration: Some(true),
        archive_retention_days: Some(30),
        max_sessions: Some(2),
        certificate: Some("/etc/certs/a.pem".into()),
        private_key: Some("/etc/certs/a.key".into()),
        disabled_modules: Some(vec!["mam".into(), "muc".into()]),
    };
    assert!(d.set_domain_settings("a.example", &settings).await.unwrap());
    assert_eq!(
        d.domain("a.example").await.unwrap().unwrap().settings,
        settings
    );
    assert!(!d
        .set_domain_settings("nope.example", &settings)
        .await
        .unwrap());
    assert!(d
        .set_domain_state("b.example", DomainState::Removing)
        .await
        .unwrap());
    assert_eq!(
        d.domain("b.example").await.unwrap().unwrap().state,
        DomainState::Removing
    );
    let v4 = d.domains_version().await.unwrap();
    assert!(d.delete_domain("b.example").await.unwrap());
    assert!(d.domains_version().await.unwrap() > v4);
    assert!(!d.delete_domain("b.example").await.unwrap());
    assert!(d.domain("b.example").await.unwrap().is_none());
    assert!(d.domain(odd).await.unwrap().is_some());
}
