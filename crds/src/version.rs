//! The API's versions: `v1beta1`, which every program speaks and the API server stores, and `v1alpha1`, still
//! served (deprecated) so that manifests and clients written for it keep working. The two have the same fields,
//! so the API server converts between them by their `apiVersion` alone (the CRD's conversion strategy `None`);
//! the CRD is generated with both from the one set of types.

use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition,
};

use crate::ApiError;
use crate::spec::GROUP;

/// A version of the `weightstream.dev` API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ApiVersion {
    /// The first version: served, deprecated.
    V1alpha1,
    /// The current version: the types of this crate, and the one the API server stores.
    V1beta1,
}

impl ApiVersion {
    /// Every version, oldest first.
    pub const ALL: [ApiVersion; 2] = [ApiVersion::V1alpha1, ApiVersion::V1beta1];
    /// The version the types speak and the API server stores.
    pub const STORED: ApiVersion = ApiVersion::V1beta1;

    /// Its name in the API (`v1beta1`).
    pub const fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1alpha1 => "v1alpha1",
            ApiVersion::V1beta1 => "v1beta1",
        }
    }

    /// The `apiVersion` a manifest gives (`weightstream.dev/v1beta1`).
    pub fn api_version(self) -> String {
        format!("{GROUP}/{}", self.as_str())
    }

    /// The version a manifest's `apiVersion` names, if it is one of ours.
    pub fn from_api_version(api_version: &str) -> Option<ApiVersion> {
        let (group, version) = api_version.split_once('/')?;
        (group == GROUP).then_some(())?;
        ApiVersion::ALL.into_iter().find(|v| v.as_str() == version)
    }

    /// What the API server (and `wsctl`) tells a client that uses this version, when it is deprecated.
    pub fn deprecation(self) -> Option<String> {
        match self {
            ApiVersion::V1alpha1 => Some(format!(
                "{} TrainingJob is deprecated: use {} (the same fields; change only the apiVersion)",
                self.api_version(),
                ApiVersion::STORED.api_version()
            )),
            ApiVersion::V1beta1 => None,
        }
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The CustomResourceDefinition with every version: `crd` (generated from the types, at [`ApiVersion::STORED`])
/// with each older version added beside it under the same schema, served and deprecated, and the conversion
/// strategy `None`.
pub fn with_every_version(mut crd: CustomResourceDefinition) -> Result<CustomResourceDefinition, ApiError> {
    let current = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == ApiVersion::STORED.as_str())
        .cloned()
        .ok_or_else(|| ApiError::Internal(format!("the generated CRD has no version {}", ApiVersion::STORED)))?;
    let mut versions = Vec::new();
    for v in ApiVersion::ALL {
        let mut entry = current.clone();
        entry.name = v.as_str().into();
        entry.storage = v == ApiVersion::STORED;
        entry.served = true;
        entry.deprecation_warning = v.deprecation();
        entry.deprecated = entry.deprecation_warning.as_ref().map(|_| true);
        versions.push(entry);
    }
    crd.spec.versions = versions;
    crd.spec.conversion = Some(CustomResourceConversion { strategy: "None".into(), webhook: None });
    Ok(crd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_round_trip_through_their_api_version_and_only_ours_parse() {
        for v in ApiVersion::ALL {
            assert_eq!(ApiVersion::from_api_version(&v.api_version()), Some(v));
            assert_eq!(v.to_string(), v.as_str());
        }
        for other in ["v1beta1", "apps/v1beta1", "weightstream.dev/v2", "weightstream.dev/", ""] {
            assert_eq!(ApiVersion::from_api_version(other), None, "{other}");
        }
        assert_eq!(crate::spec::VERSION, ApiVersion::STORED.as_str(), "the types speak the stored version");
    }

    #[test]
    fn every_version_is_served_with_one_schema_and_only_the_current_one_is_stored() {
        use kube::CustomResourceExt;
        let crd = with_every_version(crate::TrainingJob::crd()).unwrap();
        let names: Vec<_> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["v1alpha1", "v1beta1"]);
        let stored: Vec<_> = crd.spec.versions.iter().filter(|v| v.storage).map(|v| v.name.as_str()).collect();
        assert_eq!(stored, ["v1beta1"]);
        assert!(crd.spec.versions.iter().all(|v| v.served));
        let (old, new) = (&crd.spec.versions[0], &crd.spec.versions[1]);
        assert_eq!(old.schema, new.schema, "the same fields: conversion is by apiVersion alone");
        assert_eq!(old.subresources, new.subresources);
        assert_eq!(old.additional_printer_columns, new.additional_printer_columns);
        assert_eq!((old.deprecated, new.deprecated), (Some(true), None));
        assert!(old.deprecation_warning.as_deref().is_some_and(|w| w.contains("weightstream.dev/v1beta1")));
        assert_eq!(crd.spec.conversion.map(|c| c.strategy).as_deref(), Some("None"));
    }
}
